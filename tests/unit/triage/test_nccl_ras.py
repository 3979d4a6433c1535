"""NCCL RAS outputs as a second hang signal: the parser on recorded outputs (tests/fixtures/nccl_ras, sources in
its SOURCES.md), and triage on Flight Recorder dumps and a recorded diag trace with RAS files beside them. No
multi-GPU NCCL job runs here: every RAS output is one NCCL printed, copied from its source."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from diag.triage import nccl_ras
from diag.triage.analysis import triage
from diag.triage.sources import read_input
from diag.triage.watch import stall_of
from tests.triage.fr_cases import FIXTURES as FR_FIXTURES
from tests.triage.fr_cases import Job

RAS = Path(__file__).resolve().parents[2] / "fixtures" / "nccl_ras"
TRACES = Path(__file__).resolve().parents[2] / "fixtures" / "triage"


def _read(name: str) -> nccl_ras.RasReport:
    report = nccl_ras.read_file(RAS / name)
    assert report.ok, report.notes
    return report


def _only_comm(report: nccl_ras.RasReport) -> nccl_ras.RasComm:
    assert len(report.comms) == 1
    return report.comms[0]


# -- the parser, on every recorded output --------------------------------------------------------------------------


def test_every_fixture_is_listed_in_sources_and_parses():
    sources = (RAS / "SOURCES.md").read_text()
    files = sorted(p.name for p in RAS.iterdir() if p.name != "SOURCES.md")
    assert len(files) == 11
    for name in files:
        assert f"`{name}`" in sources, name
        assert nccl_ras.read_file(RAS / name).ok, name


def test_text_mismatch_names_the_ranks_behind_when_ras_lists_the_few_ahead():
    """2.26: the two ranks ahead are listed; the 30 behind are the rest of the 32-rank communicator."""
    report = _read("issue1911_nccl2.26.2_allgather_mismatch.txt")
    comm = _only_comm(report)
    assert report.version == "2.26.2"
    assert (comm.comm_hash, comm.size, comm.ranks_per_node, comm.status) == ("fa93daea854b060b", 32, "8", "RUNNING")
    (mismatch,) = comm.mismatches
    assert mismatch.op == "AllGather"
    assert [(g.count, g.n_ranks) for g in mismatch.groups] == [(640, 30), (641, 2)]
    assert mismatch.behind == [r for r in range(32) if r not in (12, 13)]
    assert (comm.ranks[12].pid, comm.ranks[12].host, comm.ranks[12].gpu) == (323032, "10.137.190.124", 4)


def test_text_mismatch_lists_the_ranks_behind_in_the_2_24_wording():
    comm = _only_comm(_read("docs_mismatch_collective_counts.txt"))
    (mismatch,) = comm.mismatches
    assert mismatch.op == "collective"
    assert [(g.count, g.n_ranks) for g in mismatch.groups] == [(6650, 26), (6649, 6)]
    assert mismatch.behind == [0, 2, 3, 4, 5, 7]
    assert comm.ranks[7].pid == 483079


def test_text_status_mismatch_is_read_without_a_count_disagreement():
    comm = _only_comm(_read("docs_status_mismatch.txt"))
    assert comm.comm_hash == "9e17999afaa87dbb" and comm.size == 32 and comm.status == "FINALIZE"
    assert comm.mismatches == []
    assert {r: comm.ranks[r].status for r in (0, 8, 4, 20)} == {
        0: "RUNNING",
        8: "RUNNING",
        4: "FINALIZE",
        20: "FINALIZE",
    }


def test_healthy_text_has_no_communicator_problem():
    report = _read("issue1730_nccl2.26.2_healthy_256.txt")
    assert report.summary and report.comms == [] and report.dead == [] and report.unreachable == []


def test_text_incomplete_names_the_missing_rank_and_the_unreachable_process():
    report = _read("docs_incomplete_timeout.txt")
    comm = _only_comm(report)
    assert comm.comm_hash == "cf264af53edbe986" and comm.size == 32 and comm.n_missing == 1
    assert list(comm.missing) == [21]
    assert [(p.pid, p.host, p.gpus) for p in report.unreachable] == [(3487984, "172.16.64.213", "5")]
    assert report.timeouts == 2 and report.dead == []


def test_text_dead_names_the_dead_process():
    report = _read("docs_dead.txt")
    assert [(p.pid, p.host, p.gpus) for p in report.dead] == [(3487984, "172.16.64.213", "5")]
    assert list(_only_comm(report).missing) == [21]


def test_monitor_mode_peer_dead_is_a_dead_process_not_a_poll():
    report = _read("docs_monitor_peer_dead.txt")
    assert [(p.pid, p.host) for p in report.dead] == [(1524345, "172.16.64.245")]
    assert not report.summary


def test_json_names_the_unresponsive_rank_with_its_process():
    report = _read("docs_nccl2.29.1.json")
    comm = _only_comm(report)
    assert report.version == "2.29.1" and comm.comm_hash == "ae94423cfbb2ef4a" and comm.size == 2
    assert list(comm.ranks) == [0] and comm.ranks[0].status == "RUNNING"
    missing = comm.missing[1]
    assert (missing.pid, missing.host, missing.unresponsive, missing.dead) == (1524345, "172.16.64.245", True, False)
    assert comm.mismatches == []


def test_json_mismatch_names_the_rank_one_operation_behind():
    comm = _only_comm(_read("ray_a10g_nccl2.28.9_mismatch.json"))
    assert {r: rank.counts["AllReduce"] for r, rank in comm.ranks.items()} == {0: 101, 1: 100, 2: 101, 3: 101}
    (mismatch,) = comm.mismatches
    assert (mismatch.op, mismatch.behind) == ("AllReduce", [1])
    assert comm.ranks[1].host == "10.0.109.86"


def test_json_of_nccl_2_28_with_a_missing_rank_is_repaired():
    raw = (RAS / "ray_nccl2.28.9_unresponsive_rank.json").read_text()
    with pytest.raises(ValueError):
        __import__("json").loads(raw)  # what NCCL 2.28.9 printed is not JSON
    report = _read("ray_nccl2.28.9_unresponsive_rank.json")
    assert any("missing comma" in note for note in report.notes)
    comm = _only_comm(report)
    assert comm.comm_hash == "a1349768e9517ed7" and comm.ranks[0].counts["AllReduce"] == 4
    assert (comm.missing[1].pid, comm.missing[1].unresponsive, comm.missing[1].dead) == (10017, True, False)


def test_json_with_several_communicators_flags_only_the_one_in_disagreement():
    report = _read("ray_nccl2.28.9_multi_comm.json")
    assert [c.comm_hash for c in report.comms] == ["4e0104c2022fa2f9", "beebea5449e0a7e7", "d0d47b5885b3b54b"]
    assert [c.size for c in report.comms] == [2, 2, 4]
    flagged = {c.comm_hash: c.mismatches[0].behind for c in report.comms if c.mismatches}
    assert flagged == {"4e0104c2022fa2f9": [1]}


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"\x00\xff\xfe binary",
        b'{"nccl_version": "2.29.1", "communicators": [',
        b'{"communicators": "many"}',
        b"[1, 2, 3]",
        b"Traceback (most recent call last):\n  nothing to do with RAS\n",
        b'{"communicators": [{"hash": "0x1", "ranks": [{"rank": "x"}, 7], "missing_ranks": {"a": 1}}]}',
    ],
    ids=["empty", "binary", "cut_json", "wrong_type", "json_list", "other_text", "odd_fields"],
)
def test_bad_input_is_a_note_never_a_crash(tmp_path, content):
    path = tmp_path / "nccl_ras.json"
    path.write_bytes(content)
    report = nccl_ras.read_file(path)
    if report.ok:  # odd fields inside a valid document: read what is there
        assert report.comms[0].ranks == {} and report.comms[0].missing == {}
    else:
        assert report.notes and "nccl_ras.json" in report.notes[0]


# -- successive polls ----------------------------------------------------------------------------------------------


def _moved(report: nccl_ras.RasReport, delta: int) -> nccl_ras.RasReport:
    """The same output with every rank's AllReduce count raised by ``delta`` (made here, from the recorded one)."""
    text = Path(report.source).read_text()
    for count in (100, 101):
        text = text.replace(f'"AllReduce": {count}', f'"AllReduce": {count + delta}')
    return nccl_ras.parse(text, "nccl_ras_later.json")


def test_progress_calls_a_disagreement_frozen_only_when_unchanged_across_two_polls():
    first = _read("ray_a10g_nccl2.28.9_mismatch.json")
    assert nccl_ras.progress([first]).frozen == {}
    frozen = nccl_ras.progress([first, first])
    assert list(frozen.frozen) == ["f31e5874c3f25459"] and frozen.polls == 2
    moving = nccl_ras.progress([first, _moved(first, 5)])
    assert moving.frozen == {} and moving.moving == ["f31e5874c3f25459"]
    # a later poll in which nothing moved again counts from there
    later = _moved(first, 5)
    assert list(nccl_ras.progress([first, later, later]).frozen) == ["f31e5874c3f25459"]


def test_progress_of_text_polls_and_monitor_outputs_between_them():
    mismatch = _read("issue1911_nccl2.26.2_allgather_mismatch.txt")
    monitor = _read("docs_monitor_peer_dead.txt")
    assert list(nccl_ras.progress([mismatch, monitor, mismatch]).frozen) == ["fa93daea854b060b"]
    healthy = _read("issue1730_nccl2.26.2_healthy_256.txt")
    assert nccl_ras.progress([healthy, mismatch]).moving == ["fa93daea854b060b"]


# -- triage with RAS files beside the dumps or the trace ------------------------------------------------------------


def _fr_dir(tmp_path: Path, job: Job, without=(), ras: dict[str, str | bytes] | None = None) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    job.writer(without=without)(tmp_path)
    for name, source in (ras or {}).items():
        data = source if isinstance(source, bytes) else (RAS / source).read_bytes()
        (tmp_path / name).write_bytes(data)
    return tmp_path


def _rank_1_never_dumped() -> Job:
    """2 ranks: rank 0 waits in an all_reduce; rank 1 left no Flight Recorder dump."""
    job = Job(2).steps()
    job.coll("all_reduce", [[64]], [[64]], "started", ranks=[0])
    job.op(1, "all_reduce", [[64]], [[64]], "started")
    return job


def test_unresponsive_rank_named_by_ras_beside_flight_recorder_dumps(tmp_path):
    path = _fr_dir(tmp_path, _rank_1_never_dumped(), (1,), {"nccl_ras.json": "docs_nccl2.29.1.json"})
    data = read_input(path)
    assert data.skipped == []  # the RAS file is not taken for a dump
    verdict = triage(data)
    assert (verdict.verdict, verdict.culprit_ranks) == ("missing_ranks", [1])
    assert "unresponsive by NCCL RAS (nccl_ras.json)" in verdict.ranks[1].detail
    assert "process 1524345 on 172.16.64.245" in verdict.ranks[1].detail
    assert any(line.startswith("NCCL RAS (nccl_ras.json)") and "global rank 1" in line for line in verdict.evidence)


def test_rank_ras_declared_dead_is_a_dead_rank(tmp_path):
    """The user guide's JSON sample and its PEER_DEAD event (the same process): rank 1 is dead, not missing."""
    ras = {"nccl_ras_1.json": "docs_nccl2.29.1.json", "nccl_ras_monitor.txt": "docs_monitor_peer_dead.txt"}
    verdict = triage(read_input(_fr_dir(tmp_path, _rank_1_never_dumped(), (1,), ras)))
    assert (verdict.verdict, verdict.culprit_ranks) == ("dead_rank", [1])
    assert verdict.ranks[1].state == "dead"
    assert "considered dead by NCCL RAS" in verdict.ranks[1].detail
    assert any("process 1524345 on node 172.16.64.245 (GPU 1) considered dead" in line for line in verdict.evidence)


def test_without_ras_the_same_dumps_name_a_missing_rank(tmp_path):
    """What the two tests above add: without RAS the rank is missing, with no word on its process."""
    verdict = triage(read_input(_fr_dir(tmp_path, _rank_1_never_dumped(), (1,))))
    assert (verdict.verdict, verdict.culprit_ranks) == ("missing_ranks", [1])
    assert verdict.ranks[1].state == "no_data" and "RAS" not in " ".join(verdict.evidence)


def _four_ranks_done() -> Job:
    return Job(4).steps()  # every all_reduce completed on every rank: Flight Recorder sees no hang


def test_ras_mismatch_alone_is_a_hang_only_when_counts_stay_put(tmp_path):
    one = triage(read_input(_fr_dir(tmp_path / "one", _four_ranks_done(), ras=_polls(1))))
    assert one.verdict == "no_problem"
    assert any("one poll: a hang only if unchanged across 2 polls" in line for line in one.evidence)
    stuck = triage(read_input(_fr_dir(tmp_path / "two", _four_ranks_done(), ras=_polls(2))))
    assert (stuck.verdict, stuck.culprit_ranks) == ("missing_ranks", [1])
    assert stuck.evidence[0].startswith("NCCL RAS: a communicator's operation counts disagree")
    assert any("global rank 1 behind; unchanged across the last 2 polls" in line for line in stuck.evidence)


def test_ras_mismatch_with_counts_moving_is_no_hang(tmp_path):
    first = _read("ray_a10g_nccl2.28.9_mismatch.json")
    later = Path(first.source).read_text().replace('"AllReduce": 101', '"AllReduce": 105')
    later = later.replace('"AllReduce": 100', '"AllReduce": 104')
    ras = {"nccl_ras_1.json": "ray_a10g_nccl2.28.9_mismatch.json", "nccl_ras_2.json": later.encode()}
    verdict = triage(read_input(_fr_dir(tmp_path, _four_ranks_done(), ras=ras)))
    assert verdict.verdict == "no_problem"
    assert any("counts moving between polls: not a hang" in line for line in verdict.evidence)


def _polls(n: int) -> dict[str, str]:
    return {f"nccl_ras_{i}.json": "ray_a10g_nccl2.28.9_mismatch.json" for i in range(n)}


def test_watch_stalls_on_ras_counts_that_stay_put(tmp_path):
    running = stall_of(read_input(_fr_dir(tmp_path / "one", _four_ranks_done(), ras=_polls(1))), 0.0, 20.0)
    assert running.state == "running"
    stalled = stall_of(read_input(_fr_dir(tmp_path / "two", _four_ranks_done(), ras=_polls(2))), 0.0, 20.0)
    assert (stalled.state, stalled.detail) == ("stalled", "NCCL RAS: operation counts unchanged across polls")


def test_corrupt_ras_file_is_a_note_and_the_real_gloo_verdict_stands(tmp_path):
    run = FR_FIXTURES / "gloo_missing_rank_1"
    shutil.copytree(run, tmp_path / "plain")
    shutil.copytree(run, tmp_path / "with_ras")
    (tmp_path / "with_ras" / "nccl_ras.json").write_bytes(b'{"nccl_version": "2.29.1", "communicators": [{')
    plain = triage(read_input(tmp_path / "plain"))
    verdict = triage(read_input(tmp_path / "with_ras"))
    assert (verdict.verdict, verdict.culprit_ranks) == (plain.verdict, plain.culprit_ranks)
    assert any(line.startswith("NCCL RAS: nccl_ras.json: RAS JSON unreadable") for line in verdict.evidence)


def test_recorded_trace_with_a_ras_output_of_another_communicator_keeps_it_as_evidence(tmp_path):
    """A real diag trace (3 ranks, rank 2 SIGKILLed inside an all_reduce) beside a 32-rank communicator's RAS
    output: RAS ranks cannot be taken for global ranks (other size, no matching process), so they stay
    communicator-level evidence and the verdict is the trace's."""
    trace = tmp_path / "trace"
    shutil.copytree(TRACES / "sigkill_inside_all_reduce", trace)
    (trace / "nccl_ras.txt").write_bytes((RAS / "docs_incomplete_timeout.txt").read_bytes())
    verdict = triage(read_input(trace))
    assert (verdict.verdict, verdict.culprit_ranks) == ("dead_rank", [2])
    line = next(e for e in verdict.evidence if e.startswith("NCCL RAS (nccl_ras.txt): communicator cf264af53edbe986"))
    assert "not mapped to global ranks: rank 21" in line
    assert any("process 3487984 on node 172.16.64.213 (GPU 5) sent no data" in e for e in verdict.evidence)


def test_ras_maps_a_dead_process_by_its_pid_and_the_rank_s_own_records_win(tmp_path):
    """The recorded trace's rank 0 (pid 15320 in its manifest) reported dead in a PEER_DEAD event line (written
    here in the format of the user guide's, with this trace's pid): mapped by pid, shown in rank 0's detail,
    and the verdict stays the trace's: rank 0's own exit record says what happened to it."""
    trace = tmp_path / "trace"
    shutil.copytree(TRACES / "sigkill_inside_all_reduce", trace)
    event = "[2025-12-19 13:07:07] PEER_DEAD: Process 15320 on node vm managing GPU 0\n"
    (trace / "nccl_ras_monitor.txt").write_text(event)
    verdict = triage(read_input(trace))
    assert (verdict.verdict, verdict.culprit_ranks) == ("dead_rank", [2])
    assert verdict.ranks[0].state != "dead"
    assert "its process 15320 on vm considered dead by NCCL RAS (nccl_ras_monitor.txt)" in verdict.ranks[0].detail


def test_analyze_reads_the_ras_output_beside_a_trace_as_triage_does(tmp_path):
    """``diag analyze``'s failure finding asks triage who the others waited for (``input_from_trace`` on the
    trace it loaded): a RAS output saved in the trace directory is read there too."""
    from diag.trace.loader import load
    from diag.triage.sources import input_from_trace

    trace = tmp_path / "trace"
    shutil.copytree(TRACES / "sigkill_inside_all_reduce", trace)
    (trace / "nccl_ras.txt").write_bytes((RAS / "docs_incomplete_timeout.txt").read_bytes())
    from_trace = triage(input_from_trace(load(trace)))
    from_directory = triage(read_input(trace))
    assert from_trace.verdict == from_directory.verdict == "dead_rank"
    ras_lines = [e for e in from_directory.evidence if e.startswith("NCCL RAS")]
    assert ras_lines and ras_lines == [e for e in from_trace.evidence if e.startswith("NCCL RAS")]
