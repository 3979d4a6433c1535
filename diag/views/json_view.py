"""The JSON contract (docs/analyze.md documents every key)."""

from __future__ import annotations

import json


def render_json(report) -> str:
    return json.dumps(report.to_dict(), indent=1, allow_nan=False)
