"""A fixed sample of the fault-injection suite (benchmarks/faults.py): real 4-rank gloo jobs, each with one
planted fault, judged by ``diag analyze`` or ``diag triage`` as a user would; the verdict and the culprit must
both be right. The whole suite, randomised, with its accuracy and false-alarm figures: docs/benchmarks.md."""

import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import faults  # noqa: E402

pytestmark = pytest.mark.slow

SAMPLE = [
    faults.Case("healthy", rank=0, step=3, model="ddp", ranks=4),
    faults.Case("compute", rank=2, step=2, model="ddp", ranks=4),
    faults.Case("data", rank=1, step=2, model="fsdp2", ranks=4),
    faults.Case("exception", rank=3, step=3, model="manual", ranks=4),
    faults.Case("sigkill", rank=1, step=3, model="manual", ranks=4),
    faults.Case("loader_hang", rank=2, step=3, model="manual", ranks=4),
    faults.Case("desync_op", rank=0, step=2, model="manual", ranks=4),
    faults.Case("late", rank=1, step=3, model="manual", ranks=4),
    faults.Case("desync_shape", rank=3, step=2, model="manual", ranks=4),
]


@pytest.mark.parametrize("case", SAMPLE, ids=[c.fault for c in SAMPLE])
def test_fault_is_named_with_its_culprit(case, tmp_path):
    outcome = faults.run_case(case, tmp_path)
    assert outcome.error is None, outcome.error
    assert outcome.verdict_right, f"{case}: gave {outcome.given}, wanted {outcome.expected}"
    assert outcome.culprit_right, f"{case}: gave {outcome.culprits}, wanted {case.expected_culprits}"
    if case.fault == "healthy":
        assert outcome.false_alarms == []
