"""A report's section as its analysis module declares it: the name it goes by (its field of the Report, its key
in the JSON and the key views render it by), its findings and its JSON. ``report.SECTIONS`` lists every
module's ``SECTION`` in the order the report, its JSON, its text and its HTML present them."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd

from diag.analysis.findings import Finding, FindingContext


@dataclass(frozen=True)
class Section:
    """``findings``: ``(result, FindingContext) -> findings`` (not called where the result is None: no pipeline,
    no torch.profiler trace). ``json``: the result's keys in the JSON (default ``{name: json_safe(result)}``).
    ``in_json``: ``always`` (null where the result is None), ``when_present`` (no key where it is None: sections
    added after the contract's first version, so the JSON of runs without them is what it was) or ``never``.
    ``in_report``: False for a result the Report carries elsewhere (the failures: in its run section)."""

    name: str
    findings: Callable[[Any, FindingContext], list[Finding]] | None = None
    json: Callable[[Any], dict] | None = None
    in_json: Literal["always", "when_present", "never"] = "always"
    in_report: bool = True

    def json_keys(self, result) -> dict:
        """The section's keys in the report's JSON."""
        if self.in_json == "never" or (result is None and self.in_json == "when_present"):
            return {}
        if result is None:
            return {self.name: None}
        return self.json(result) if self.json is not None else {self.name: json_safe(result)}

    def findings_of(self, result, ctx: FindingContext) -> list[Finding]:
        return [] if self.findings is None or result is None else self.findings(result, ctx)


def json_safe(value):
    """Dataclasses, numpy scalars and NaN to JSON-safe Python values (NaN and inf become null); the JSON views
    and diag compare use it."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: json_safe(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, np.ndarray):
        return [json_safe(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is pd.NA or value is pd.NaT:
        return None
    return value
