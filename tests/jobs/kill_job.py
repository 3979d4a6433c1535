"""A single-rank loop of ~20 ms steps that prints each finished step, for the SIGKILL test."""

import sys
import time

import diag

diag.init(sys.argv[1], telemetry=False, watchdog=False, flush_interval_s=float(sys.argv[2]))
step = 0
while True:
    with diag.step():
        time.sleep(0.02)
    print(step, time.time(), flush=True)
    step += 1
