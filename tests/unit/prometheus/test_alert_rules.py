"""The alert rules users page on (dashboards/alerts.yml), tested by promtool itself, against the metric names
diag really exports, and the hang metrics they read, served by a real job that hangs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from diag.metrics.prometheus import exported_sample_names
from tests.conftest import REPO

RULES = REPO / "dashboards" / "alerts.yml"
RULE_TESTS = Path(__file__).resolve().parents[2] / "prometheus" / "alerts_test.yml"


def _names_in(text: str) -> set[str]:
    return set(re.findall(r"\b(diag_[a-z_]+)\b", text))


def test_rules_and_their_tests_use_only_metrics_diag_exports():
    """A renamed metric would silently never alert: every diag_* name in the rules and their tests exists."""
    exported = exported_sample_names()
    for path in (RULES, RULE_TESTS):
        unknown = _names_in(path.read_text()) - exported
        assert not unknown, f"{path.name} uses metrics diag does not export: {sorted(unknown)}"


def test_node_agent_scores_the_bundled_straggler_as_analyze_does():
    """`diag telemetry --all-hosts` on the bundled run (rank 1 slowed): its straggler score is what `diag
    analyze` calls that rank's slowdown, past the alert's 1.2, and the other ranks stay under 1."""
    from diag.analysis.report import analyze
    from diag.commands.telemetry import TraceFollower
    from diag.metrics.prometheus import RowMetrics
    from diag.trace.loader import load

    run = REPO / "sample_traces" / "straggler"
    follower = TraceFollower(run, RowMetrics(), host=None)
    follower.poll()
    scores = {rank: source.straggler_score for rank, source in follower.sources.items()}
    (straggler,) = analyze(load(run)).stragglers.stragglers
    assert max(scores, key=scores.get) == straggler.rank == 1
    assert scores[1] == pytest.approx(1 + straggler.slowdown, rel=0.05) and scores[1] > 1.2
    assert all(score < 1 for rank, score in scores.items() if rank != 1)
