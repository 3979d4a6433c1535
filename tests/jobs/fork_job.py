"""A one-process job that forks inside step 10 (a user's os.fork, a subprocess helper without exec): the child
leaves the step by SystemExit, as a forked helper does when it is done. Rows are still buffered in the parent
at the fork (a long flush interval), so a child that flushed them would write them into the parent's files a
second time.

usage: fork_job.py TRACE_DIR
"""

import os
import sys

import torch

import diag

diag.init(sys.argv[1], telemetry=False, flush_interval_s=30.0)
model = torch.nn.Linear(16, 4)
for step in range(30):
    with diag.step():
        with diag.phase("forward"):
            model(torch.randn(8, 16)).sum().backward()
        if step == 10:
            child = os.fork()
            if child == 0:
                sys.exit(0)  # leaves the step in the child: the step-error path runs there
            os.waitpid(child, 0)
diag.finish()
