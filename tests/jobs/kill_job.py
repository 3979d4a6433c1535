"""A single-rank loop of ~20 ms steps that prints each finished step, for the SIGKILL test.

usage: kill_job.py TRACE_DIR FLUSH_INTERVAL_S [TRACE_FORMAT]  (trace format 2, the default, or 1: CSV)"""

import sys
import time

import diag

trace_format = int(sys.argv[3]) if len(sys.argv) > 3 else 2
diag.init(sys.argv[1], telemetry=False, watchdog=False, flush_interval_s=float(sys.argv[2]), trace_format=trace_format)
step = 0
while True:
    with diag.step():
        time.sleep(0.02)
    print(step, time.time(), flush=True)
    step += 1
