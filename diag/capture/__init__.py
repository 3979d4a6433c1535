"""Capture: runs inside the training processes and imports torch. Writes the format of diag.trace.schema."""
