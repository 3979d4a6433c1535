"""Verdicts on traces recorded by real fault-injection runs (diag/testing/faults.py, 2- and 3-rank gloo jobs on
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


def test_pipeline_stage_that_computes_past_the_timeout_is_missing_though_no_collective_is_pending():
    """torch.distributed.pipelining's Schedule1F1B over 4 gloo ranks, one stage each: stage 2 computes past the
    timeout in a step's forward. Its neighbours wait in the schedule's batched sends and receives, which are
    numbered per rank (no group sequence number to be pending under), time out, and every rank raises. The
    watchdog's stall dumps hold the answer: three ranks stalled in communication, rank 2 in its compute."""
    verdict = triage(read_input(FIXTURES / "pipeline_stage_hang"))
    assert verdict.verdict == "missing_ranks", verdict.evidence
    assert verdict.culprit_ranks == [2], verdict.evidence
    assert verdict.ranks[2].state == "stuck_in_compute"
    assert {verdict.ranks[r].state for r in (0, 1, 3)} == {"waiting_in_collective"}
    assert verdict.action.kind == "fix_code"


def test_pipeline_stage_sigkilled_is_dead_not_a_desync_of_its_sends_and_receives():
    """The same pipeline on 3 ranks: stage 1 is SIGKILLed in a backward. The ranks' k-th sends and receives
    differ in size (the schedule's shape exchange, then activations), which matched by sequence number as
    collectives read "desync"; rank 0 raised "connection closed" only after rank 1's heartbeat stopped."""
    verdict = triage(read_input(FIXTURES / "pipeline_stage_sigkill"))
    assert verdict.verdict == "dead_rank", verdict.evidence
    assert verdict.culprit_ranks == [1], verdict.evidence
    assert verdict.action.kind == "restart"


def test_a_sigterm_handlers_broadcast_after_the_timeout_is_no_desync():
    """Lightning's Trainer on 3 ranks: rank 1's data loader never answers in step 1, ranks 0 and 2 wait in the
    step's broadcast, time out and finish. The launcher then SIGTERMs rank 1, whose Lightning SIGTERM handler
    broadcasts at the same sequence number, 10 s after the others gave up: aftermath, not a desync."""
    verdict = triage(read_input(FIXTURES / "lightning_loader_hang_then_sigterm"))
    assert verdict.verdict == "missing_ranks", verdict.evidence
    assert verdict.culprit_ranks == [1], verdict.evidence
    assert verdict.ranks[1].last_phase == "data_wait"


def test_pipeline_stage_stalled_in_its_optimizer_step_is_missing_from_the_next_steps_sends():
    """2 pipeline stages: stage 0 computes past the timeout in its optimizer step of step 4; stage 1, with no
    barrier between steps, waits in step 5's receive. The culprit stalls one step behind those it keeps."""
    verdict = triage(read_input(FIXTURES / "pipeline_optimizer_hang"))
    assert verdict.verdict == "missing_ranks", verdict.evidence
    assert verdict.culprit_ranks == [0], verdict.evidence
    assert verdict.action.kind == "fix_code"


def test_pipeline_stage_frozen_is_the_rank_without_a_stall_dump_and_is_evicted():
    """8 pipeline stages: stage 2 is SIGSTOPped in a forward (its watchdog thread with it) and continued after
    the others' timeout. Every other rank's stall dump is in communication; rank 2 wrote none."""
    verdict = triage(read_input(FIXTURES / "pipeline_stage_frozen"))
    assert verdict.verdict == "missing_ranks", verdict.evidence
    assert verdict.culprit_ranks == [2], verdict.evidence
    assert verdict.ranks[2].state == "unresponsive"
    assert verdict.action.kind == "evict"


def test_late_rank_evidence_quotes_the_timeout_when_a_closed_connection_was_recorded_first():
    """4 ranks: rank 3 is stopped in step 3's forward and continued after the others timed out in the
    all_reduce. Rank 1's record was edited to what a loaded host records: "connection closed by peer" (rank 0
    timed out and exited) stamped before rank 0's timeout. The first rank out says why it gave up; the
    timeout, which is what says rank 3 was absent, is quoted too."""
    verdict = triage(read_input(FIXTURES / "late_rank_after_a_peer_closed"))
    assert verdict.verdict == "missing_ranks" and verdict.culprit_ranks == [3], verdict.evidence
    evidence = "\n".join(verdict.evidence)
    assert "rank 1 gave up" in evidence and "Connection closed by peer" in evidence, evidence
    assert "rank 0 timed out" in evidence and "Timed out waiting" in evidence, evidence


def test_pipeline_dtype_desync_names_the_rank_not_its_receives():
    """A 3-stage pipeline whose stage 0 all-reduces the step's loss summary in float64, the others in float32;
    gloo aborts rank 2. The schedule's receives are numbered like the group's collectives (seq 5 is both an
    all_reduce and a recv here): the desync is the all_reduce's, and its culprit rank 0 alone."""
    verdict = triage(read_input(FIXTURES / "pipeline_dtype_desync"))
    assert verdict.verdict == "desync", verdict.evidence
    assert verdict.culprit_ranks == [0], verdict.evidence
    assert verdict.collective["op"] == "all_reduce"
    assert not any("recv" in line for line in verdict.evidence), verdict.evidence


def test_pipeline_op_desync_reads_the_collective_at_a_seq_its_sends_also_hold():
    """8 stages; stage 7 all-gathers where the others all-reduce the step's loss summary. The first and last
    stages' completed sends at seq 3 had hidden their pending all_reduce / all_gather at seq 3 (one row per
    rank and seq was kept), which read as ranks 0 and 7 missing from it."""
    verdict = triage(read_input(FIXTURES / "pipeline_op_desync"))
    assert verdict.verdict == "desync", verdict.evidence
    assert verdict.culprit_ranks == [7], verdict.evidence
    assert verdict.collective["op"] == "all_reduce"


def test_pipeline_stage_that_raises_is_the_culprit_not_the_neighbour_that_timed_out():
    """2 stages: stage 0 raises in a backward; stage 1, waiting in a send to it, times out 6 s later in the
    same step. The step failed on both; only stage 0's error is the job's own."""
    verdict = triage(read_input(FIXTURES / "pipeline_stage_exception"))
    assert verdict.verdict == "step_error", verdict.evidence
    assert verdict.culprit_ranks == [0], verdict.evidence
    assert any("rank 1 only gave up waiting for rank 0" in line for line in verdict.evidence), verdict.evidence


def test_pipeline_stage_whose_first_stall_dump_follows_the_timeout_was_frozen():
    """3 stages: stage 1 is SIGSTOPped in a forward and continued after its neighbours timed out in their sends
    and receives; once running again its watchdog dumped the stall it had been in (11.5 s without progress). A
    live watchdog dumps within its threshold: a first dump after every waiting rank gave up is a process that
    did not run meanwhile, which is the node's doing (evict), not the code's."""
    verdict = triage(read_input(FIXTURES / "pipeline_stage_frozen_after_dump"))
    assert verdict.verdict == "missing_ranks", verdict.evidence
    assert verdict.culprit_ranks == [1], verdict.evidence
    assert verdict.ranks[1].state == "unresponsive"
    assert verdict.action.kind == "evict"
    assert any("its watchdog did not run while they waited" in line for line in verdict.evidence)


def test_dtype_desync_that_gloo_aborts_a_rank_on_is_a_desync_not_a_dead_rank():
    """DeepSpeed ZeRO job, 2 ranks, at twice the cores in CPU burners: rank 1 all-reduces a float64 tensor where
    rank 0 passes float32 (step 3). gloo aborts rank 0, which receives more bytes than it expects: SIGABRT, its
    main thread inside all_reduce, its record of the call never written, so it reads as never having reached
    the collective rank 1 waits in. The culprit is rank 1, whose payload the group never issued before."""
    verdict = triage(read_input(FIXTURES / "deepspeed_dtype_desync_abort"))
    assert verdict.verdict == "desync", verdict.evidence
    assert verdict.culprit_ranks == [1], verdict.evidence
    assert (verdict.collective["pg"], verdict.collective["seq"]) == ("0", 4)
    assert any("rank 0 aborted (SIGABRT) inside all_reduce while rank 1 waited" in e for e in verdict.evidence)
    assert verdict.action.kind == "fix_code"


def test_rank_late_into_a_bucket_only_flight_recorder_saw_is_missing_not_slow():
    """3 ranks, a DDP job whose handler calls sys.exit(1), at one CPU burner per core: rank 2 computes past the
    timeout in step 4's backward. The collective pending is a DDP gradient bucket that only Flight Recorder saw
    (no step of its own); ranks 0 and 1 raised in step 4 when it timed out, and rank 2 entered it 4 s later.
    Each rank gave up at its first error after it entered the collective: rank 2 was missing, not slow."""
    verdict = triage(read_input(FIXTURES / "sys_exit_backward_late_rank"))
    assert verdict.verdict == "missing_ranks", verdict.evidence
    assert verdict.culprit_ranks == [2], verdict.evidence
    assert any("rank 2 entered only after that" in e for e in verdict.evidence)


def test_a_stall_that_cleared_then_a_signal_mid_step_is_slow_not_a_hang():
    """DeepSpeed ZeRO-1, 3 ranks, a CPU burner per core: rank 1 computes 10 s in step 3's backward. ZeRO's groups
    have torch's 30-minute timeout, so ranks 0 and 2 wait (their watchdogs dump a stall) and the job goes on to
    step 8, where the launcher's SIGTERM finds rank 1 0.4 s into a gradient all_reduce the others had not reached
    yet. The job was slow, not hung: every rank completed steps after its stall."""
    verdict = triage(read_input(FIXTURES / "deepspeed_stall_cleared_then_stopped"))
    assert verdict.verdict == "slow", verdict.evidence
    assert verdict.culprit_ranks == [1], verdict.evidence
    assert "ranks 0, 1, 2 ended by a signal while making progress, not hung" in verdict.evidence


def test_a_rank_nothing_of_which_could_be_read_is_no_clean_bill_of_health(tmp_path):
    """The straggler sample with rank 1's directory gone (removed, or unreadable to this user): ranks 0 and 2
    finished cleanly, which says nothing of rank 1. The verdict names it, and the command exits 2."""
    import shutil

    from click.testing import CliRunner

    from diag.cli import main

    run = tmp_path / "run"
    shutil.copytree(FIXTURES.parents[2] / "sample_traces" / "straggler", run)
    shutil.rmtree(run / "rank00001")
    verdict = triage(read_input(run))
    assert verdict.verdict == "incomplete" and verdict.culprit_ranks == [1], verdict.evidence
    assert verdict.evidence[0].startswith("nothing of rank 1 could be read (no rank directory")
    result = CliRunner().invoke(main, ["triage", str(run)])
    assert result.exit_code == 2 and result.output.startswith("INCOMPLETE: nothing of rank 1 could be read")


def test_a_frozen_rank_that_entered_after_the_timeout_is_evicted_not_a_code_fix():
    """FSDP2, 8 ranks, two CPU burners per core: rank 3 is SIGSTOPped in step 3's forward and continued after the
    others' timeout; it then enters the all_gather 6 s after they gave up. Its watchdog's first stall dump ('no
    progress for 11.5 s') was written after every other rank had given up: the process did not run meanwhile."""
    verdict = triage(read_input(FIXTURES / "fsdp2_frozen_rank_late"))
    assert verdict.verdict == "missing_ranks" and verdict.culprit_ranks == [3], verdict.evidence
    assert verdict.ranks[3].state == "unresponsive"
    assert verdict.action.kind == "evict"


def test_a_frozen_rank_is_found_in_a_tp_group_its_peers_heartbeats_do_not_report():
    """The mesh shape (dp=2 x tp=2), fault series 2957 run 14: rank 1 is SIGSTOPped in step 4's backward, after
    its tp all_reduce (seq 9, DTensor's: a Flight Recorder row) and before its dp all_reduce, and continued after
    the others' timeout. Rank 0 waits for it in step 5's tp all_reduce (seq 10); rank 3 in their dp group. The
    heartbeats report only the groups of diag's wrapped collectives, not the tp groups: judged from them, ranks
    0, 2 and 3 showed nothing pending in the tp groups, and triage read "slow, not hung", slowest rank 1."""
    verdict = triage(read_input(FIXTURES / "mesh_frozen_tp_groups_not_in_heartbeats"))
    assert verdict.verdict == "missing_ranks" and verdict.culprit_ranks == [1], verdict.evidence
    assert (verdict.collective["pg"], verdict.collective["seq"]) == ("3", 10)
    assert verdict.ranks[1].state == "unresponsive"
    assert verdict.action.kind == "evict"


def test_a_rank_frozen_before_its_first_step_is_found_through_its_tp_peer_and_evicted():
    """The fault suite's mesh shape (dp=2 x tp=2): rank 1 is SIGSTOPped in step 0's forward and continued after
    the others' timeout. Its tp peer, rank 0, gave up in their tensor-parallel all_reduce, which rank 1 entered
    only after that; ranks 2 and 3 waited in the world all_reduce. Rank 1 wrote no stall dump at all though the
    others waited past its 2 s threshold, and raised only after they gave up: its watchdog did not run."""
    verdict = triage(read_input(FIXTURES / "mesh_frozen_at_step0"))
    assert verdict.verdict == "missing_ranks" and verdict.culprit_ranks == [1], verdict.evidence
    assert verdict.ranks[1].state == "unresponsive"
    assert verdict.action.kind == "evict"
    assert any("rank 1: it wrote no stall dump" in line for line in verdict.evidence)


def test_rank_that_raised_its_own_error_before_its_rows_were_written_is_the_one_missing():
    """3-rank DDP job (tests/analysis/straggler_job.py ... raise): rank 1 raises in step 2's forward; ranks 0
    and 2 wait in step 2's gradient all_reduce (seq 8) until its connection closes. Recorded by a capture that
    wrote no Flight Recorder rows at an uncaught exception: rank 1 has no collectives row, only its dump, whose
    newest entry (seq 7) gloo counts completed, and rank 0's last rows are its dump's too. Rank 1 raised its own
    error: it left the job, it did not give up waiting for the others (which would make a cross-group deadlock
    of it)."""
    verdict = triage(read_input(FIXTURES / "ddp_rank_raised_rows_unwritten"))
    assert verdict.verdict == "missing_ranks" and verdict.culprit_ranks == [1], verdict.evidence
    assert (verdict.collective["pg"], verdict.collective["seq"]) == ("0", 8)
    assert verdict.action.kind == "fix_code", verdict.action.why


def test_a_broadcast_root_that_waited_for_the_late_rank_is_not_a_culprit_too():
    """Fault suite run 2924/11 (Lightning, 4 ranks, two CPU burners a core): rank 2 computes past the 6 s timeout
    in its optimizer step. Lightning's per-step broadcast from rank 0 lets ranks 1 and 3 receive and go on to
    the next all_reduce, where they time out; rank 0, the root, waits to send to rank 2, times out there, and
    enters the all_reduce only after the others gave up. It was late for rank 2: rank 2 alone is the culprit."""
    verdict = triage(read_input(FIXTURES / "lightning_root_waited_for_late_rank"))
    assert verdict.verdict == "missing_ranks" and verdict.culprit_ranks == [2], verdict.evidence
    assert any(
        line.startswith("rank 0 was late because it had waited in broadcast at seq 22 of process group 0 for rank 2")
        for line in verdict.evidence
    )


def test_eight_ranks_waiting_past_a_gloo_bucket_that_reads_never_returned_name_the_loader_rank_missing():
    """Fault suite (seed 2935, propagate shape, matmul compute, 8 ranks, the whole test suite running beside
    it): rank 3 blocks in its data loader at step 3; the other seven wait in step 3's first all_reduce (seq 12),
    time out and raise. No rank's tables were read: the heartbeats said enough. Rank 3's last heartbeat row is
    seq 10, and its Flight Recorder dump holds step 2's DDP bucket (seq 11), past that row, in gloo's lagging
    "scheduled" state: it returned, or rank 3 would not have left step 2. Not "SLOW, NOT HUNG"."""
    verdict = triage(read_input(FIXTURES / "ddp_8_ranks_loader_hang_gloo_fr_lagging"))
    assert verdict.verdict == "missing_ranks", verdict.evidence
    assert verdict.culprit_ranks == [3], verdict.evidence
    assert (verdict.collective["pg"], verdict.collective["seq"]) == ("0", 12)
    assert verdict.ranks[3].state == "stuck_in_data_loader"


def test_rank_whose_data_loader_raised_after_its_untimed_buckets_is_the_culprit_not_slow():
    """2-rank DDP job (matmul compute, one CPU burner per core beside it): rank 1's data loader raises at step 4
    and the exception ends it. Its last rows are step 3's gradient buckets, which diag writes untimed; no later
    collective of its says they returned, but its error in step 4 does: it left step 3, and DDP waits for every
    bucket before its backward returns. Rank 0 waits in step 4's first all_reduce, which rank 1 never reached.
    Not "SLOW, NOT HUNG" on a bucket every rank entered."""
    verdict = triage(read_input(FIXTURES / "ddp_data_loader_raised_after_untimed_buckets"))
    assert verdict.verdict == "dead_rank", verdict.evidence
    assert verdict.culprit_ranks == [1], verdict.evidence
    assert (verdict.collective["pg"], verdict.collective["seq"]) == ("0", 14)
    assert verdict.action.kind == "fix_code", verdict.action


def test_a_dtype_desync_whose_majority_rank_aborted_names_the_rank_that_changed_its_collective():
    """3 ranks: rank 1 passes float64 to the all_reduce every rank issues in each step's forward, where the others
    pass the float32 they always did. gloo aborts rank 0 before it records the collective, so one rank is on
    each side. The failing collective's records carry shapes its earlier records lack; the float32 side is
    still the one the group issued before, so rank 1 alone is the culprit."""
    verdict = triage(read_input(FIXTURES / "dtype_desync_majority_rank_aborted"))
    assert verdict.verdict == "desync", verdict.evidence
    assert verdict.culprit_ranks == [1], verdict.evidence
    assert any("issued 9× before" in line and "issued 0× before" in line for line in verdict.evidence)  # 3 ranks x 3


def test_rank_that_exited_between_steps_is_dead_though_its_last_buckets_read_pending():
    """2 ranks, ``sys.exit(1)`` in the handler of an exception rank 0 raised between steps 4 and 5; rank 1 then
    raised in step 5's first all_reduce (connection closed). Rank 0's last bucket of step 4 is a Flight
    Recorder row nothing timed, and its heartbeat, written at exit, completed only the collective before it;
    rank 1 is judged from its heartbeat. Rank 0 completed step 4, so the bucket returned: the hang is step 5's
    all_reduce, which rank 0 never reached, not a slow step 4."""
    verdict = triage(read_input(FIXTURES / "sys_exit_between_steps_after_lagging_buckets"))
    assert verdict.verdict == "dead_rank", verdict.evidence
    assert verdict.culprit_ranks == [0], verdict.evidence
    assert (verdict.collective["pg"], verdict.collective["seq"]) == ("0", 16)
    assert verdict.action.kind == "fix_code"
