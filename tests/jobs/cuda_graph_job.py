"""A training step captured once in a CUDA graph (``torch.cuda.graph``, a capturable AdamW) and replayed every
step, with or without diag: with it, the model and optimizer are instrumented before the warm-up and the capture
and every replay runs inside ``diag.step``. Prints the losses as JSON: a replay under diag must compute what it
computes without diag.

usage: cuda_graph_job.py TRACE_DIR STEPS WITH_DIAG(0|1)"""

import contextlib
import json
import sys

import torch

import diag

trace_dir, steps, with_diag = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
torch.manual_seed(0)
torch.cuda.set_device(0)
if with_diag:
    diag.init(trace_dir, telemetry=False)
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, capturable=True)
if with_diag:
    diag.instrument(model, optimizer)
static_input = torch.randn(256, 1024, device="cuda")
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graph asks
    for _ in range(3):
        optimizer.zero_grad(set_to_none=True)
        model(static_input).square().mean().backward()
        optimizer.step()
torch.cuda.current_stream().wait_stream(side)
graph = torch.cuda.CUDAGraph()
optimizer.zero_grad(set_to_none=False)
with torch.cuda.graph(graph):
    static_loss = model(static_input).square().mean()
    static_loss.backward()
    optimizer.step()
batches = torch.Generator(device="cuda").manual_seed(1)
losses = []
for _ in range(steps):
    with diag.step(samples=256) if with_diag else contextlib.nullcontext():
        static_input.copy_(torch.randn(256, 1024, device="cuda", generator=batches))
        graph.replay()
    losses.append(float(static_loss))
if with_diag:
    diag.finish()
print(json.dumps({"losses": losses}))
