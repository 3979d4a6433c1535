"""Analyses of a loaded trace: pure pandas/numpy functions from frames to result records (no torch, no plots).

``diag.analysis.report.analyze(trace)`` runs them all and returns a ``Report``."""
