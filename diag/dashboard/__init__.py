"""``diag dashboard``: a live Dash app over a trace directory. Imports dash; load it only when serving."""
