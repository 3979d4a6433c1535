"""A job that calls diag.step(global_step) once per micro-batch (4 micro-batches an optimizer step, 10 steps),
the mistake gradient accumulation invites; optionally run twice into one directory.

usage: micro_batch_job.py TRACE_DIR
"""

import sys

import torch

import diag

diag.init(sys.argv[1], telemetry=False)
model = torch.nn.Linear(16, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for global_step in range(10):
    for _micro_batch in range(4):
        with diag.step(global_step, samples=8):
            model(torch.randn(8, 16)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
diag.finish()
