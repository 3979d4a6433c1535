"""Test and benchmark infrastructure: not used by capture or analysis.

``diag.testing.synthetic`` writes trace directories in the real format with problems planted at known ranks,
for the tests and the scale benchmarks (``python3 -m diag.testing.synthetic --help``).

``diag.testing.faults`` is the fault-injection suite: real gloo jobs (``diag/testing/fault_job.py``, one process
per rank) of the shapes users write, each with one planted fault, judged by ``diag analyze`` or ``diag triage``
as a user would (``python3 -m diag.testing.faults --help``; results in docs/benchmarks.md).
"""
