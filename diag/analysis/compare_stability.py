"""Training stability of two runs side by side, for ``diag compare`` (issue 18): the loss at the steps both runs
recorded, and what the health analysis (``diag.analysis.health``) found in each: NaN or infinite values, loss
spikes, replicas that diverged, ranks that depart from their peers.

Pure functions over each run's ``HealthReport`` (``report.health``; every step recorded, not only the timing
window, since the first NaN is often what ended a run) and the number of steps with a non-finite value (from
the trace's ``nonfinite`` events, counted by ``nonfinite_steps`` when the run is summarised). The loss of a step
is the median over ranks (under data parallelism each rank's loss is of its own batch). None when neither run
recorded a loss or a gradient norm (``diag.record``), a non-finite value or diverged replicas.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from diag.analysis.health import HealthReport

MAX_STEPS_LISTED = 10


def nonfinite_steps(events: pd.DataFrame) -> int:
    """Steps at which some rank recorded a NaN or infinite loss or gradient norm (capture's ``nonfinite``
    events: such a value is left empty in the steps table)."""
    if events is None or events.empty or "kind" not in events or "step" not in events:
        return 0
    steps = pd.to_numeric(events.loc[events["kind"] == "nonfinite", "step"], errors="coerce")
    return int(steps.dropna().nunique())


def losses(health: HealthReport) -> dict[int, float]:
    """Step -> loss (median over ranks) for the steps with a finite loss."""
    return {
        int(p["step"]): float(p["loss_median"])
        for p in health.per_step
        if p.get("loss_median") is not None and np.isfinite(p["loss_median"])
    }


def _has_values(health: HealthReport) -> bool:
    """A loss or gradient norm recorded, a non-finite one, or replicas that diverged (parameter fingerprints
    alone, which DDP runs record by default, are not a training curve to compare)."""
    recorded = any(p.get("loss_median") is not None or p.get("grad_norm_median") is not None for p in health.per_step)
    return recorded or bool(health.first_nonfinite) or health.divergence is not None


def _run(health: HealthReport, nonfinite: int, matched: list[int]) -> dict:
    loss = losses(health)
    last = max(loss) if loss else None
    first = health.first_nonfinite[0] if health.first_nonfinite else None
    d = health.divergence
    return {
        "recorded": bool(health.recorded),
        "loss_steps": len(loss),
        "last_step": last,
        "last_loss": loss[last] if last is not None else None,
        "final_loss": loss[matched[-1]] if matched else None,  # at the last step both runs recorded
        "mean_loss": float(np.mean([loss[s] for s in matched])) if matched else None,
        "nonfinite_steps": int(nonfinite),
        "first_nonfinite": (
            {"step": first.step, "rank": first.rank, "value_name": first.value_name, "value": first.value}
            if first is not None
            else None
        ),
        "loss_spikes": len(health.spikes),
        "spike_steps": [s.step for s in health.spikes[:MAX_STEPS_LISTED]],
        "divergence": {"step": d.step, "group": d.group, "ranks": list(d.ranks)} if d is not None else None,
        "departing_ranks": sorted({x.rank for x in health.departures}),
    }


def compare_stability(
    base: HealthReport, new: HealthReport, base_nonfinite: int = 0, new_nonfinite: int = 0
) -> dict | None:
    """The ``stability`` section of a comparison (docs/compare.md), or None when neither run recorded any."""
    if not any(_has_values(h) for h in (base, new)) and not (base_nonfinite or new_nonfinite):
        return None
    b, n = losses(base), losses(new)
    matched = sorted(set(b) & set(n))
    diff = np.array([n[s] - b[s] for s in matched], dtype="float64")
    worst = int(np.argmax(np.abs(diff))) if len(diff) else None
    out = {
        "matched_steps": len(matched),
        "loss_diff_mean": float(diff.mean()) if len(diff) else None,  # new minus base, over matched steps
        "loss_diff_final": float(diff[-1]) if len(diff) else None,
        "loss_diff_max_abs": float(abs(diff[worst])) if worst is not None else None,
        "loss_diff_max_step": matched[worst] if worst is not None else None,
        "base": _run(base, base_nonfinite, matched),
        "new": _run(new, new_nonfinite, matched),
    }
    out["changes"] = changes(out["base"], out["new"])
    out["summary"] = summary_line(out)
    return out


def changes(b: dict, n: dict) -> list[str]:
    """What the new run shows that the base did not (or no longer shows), in words."""
    out = []
    if n["nonfinite_steps"] and not b["nonfinite_steps"]:
        first = n["first_nonfinite"]
        where = f" (first: {first['value_name']} {first['value']} on rank {first['rank']} at step {first['step']})"
        out.append(f"non-finite values appeared: {n['nonfinite_steps']} steps{where if first else ''}")
    elif b["nonfinite_steps"] and not n["nonfinite_steps"]:
        out.append(f"non-finite values disappeared (base: {b['nonfinite_steps']} steps)")
    if n["loss_spikes"] > b["loss_spikes"]:
        out.append(f"loss spikes: {b['loss_spikes']} -> {n['loss_spikes']} (new at steps {_steps(n['spike_steps'])})")
    elif n["loss_spikes"] < b["loss_spikes"]:
        out.append(f"loss spikes: {b['loss_spikes']} -> {n['loss_spikes']}")
    if n["divergence"] and not b["divergence"]:
        d = n["divergence"]
        out.append(f"replicas diverged at step {d['step']} (ranks {_steps(d['ranks'])})")
    elif b["divergence"] and not n["divergence"]:
        out.append("replica divergence disappeared")
    if n["departing_ranks"] != b["departing_ranks"]:
        out.append(
            f"ranks departing from their peers: {_steps(b['departing_ranks'])} -> {_steps(n['departing_ranks'])}"
        )
    return out


def summary_line(s: dict) -> str:
    b, n = s["base"], s["new"]
    if s["matched_steps"]:
        head = (
            f"loss over {s['matched_steps']} matched steps: mean {b['mean_loss']:.4g} -> {n['mean_loss']:.4g} "
            f"({s['loss_diff_mean']:+.3g}), final {b['final_loss']:.4g} -> {n['final_loss']:.4g}"
        )
    else:
        head = "no step with a loss in both runs"
    return head + "; " + ("; ".join(s["changes"]) if s["changes"] else "no new instability")


def _steps(values: list) -> str:
    return ", ".join(str(v) for v in values) if values else "none"
