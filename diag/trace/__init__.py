"""Trace format (schema), writer (used by capture) and loader (used by analysis and views)."""
