"""Test and benchmark infrastructure: not used by capture or analysis.

``diag.testing.synthetic`` writes trace directories in the real format with problems planted at known ranks,
for the tests and the scale benchmarks (``python3 -m diag.testing.synthetic --help``).
"""
