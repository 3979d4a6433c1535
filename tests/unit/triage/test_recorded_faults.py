"""Verdicts on traces recorded by real fault-injection runs (benchmarks/faults.py, 2- and 3-rank gloo jobs on
CPU), kept in tests/fixtures/triage so that the verdict logic is checked without running the jobs: the real
jobs themselves run in tests/integration/faults/test_fault_sample.py (slow). In both, the last step's DDP gradient bucket
is a row diag wrote untimed (or, on the trainer's rank 0, only Flight Recorder's gloo entry that never reads
completed), just before the collective the job hung in."""

from pathlib import Path

from diag.triage.analysis import triage
from diag.triage.sources import read_input

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "triage"


def test_trainer_rank_hung_in_its_data_loader_is_missing_from_the_next_all_reduce():
    """diag.Trainer job, 2 ranks: rank 0 blocks in its data loader at step 3; rank 1 waits in step 3's first
    all_reduce, times out, and the job catches it. Step 2's bucket was not the hang: both ranks left step 2."""
    verdict = triage(read_input(FIXTURES / "trainer_data_loader_hang"))
    assert verdict.verdict == "missing_ranks", verdict.evidence
    assert verdict.culprit_ranks == [0], verdict.evidence
    assert (verdict.collective["pg"], verdict.collective["seq"]) == ("0", 12)
    assert verdict.ranks[0].state == "stuck_in_data_loader"


def test_rank_sigkilled_inside_an_all_reduce_every_rank_entered_is_dead():
    """3 ranks: rank 2 is stopped inside step 3's all_reduce and SIGKILLed once the others have stalled there;
    they then raise (connection closed). Everyone entered it, so no rank is missing: the dead one is the cause."""
    verdict = triage(read_input(FIXTURES / "sigkill_inside_all_reduce"))
    assert verdict.verdict == "dead_rank", verdict.evidence
    assert verdict.culprit_ranks == [2], verdict.evidence
    assert (verdict.collective["pg"], verdict.collective["seq"]) == ("0", 12)
    assert verdict.ranks[2].state == "dead"
