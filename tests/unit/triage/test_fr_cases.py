"""Flight Recorder verdicts on the hard cases (issue 29 section 2): PyTorch's own analyser tests rebuilt as
NCCL-format dumps, the cases torch's analyser checks (send/recv pairs, coalesced groups, states, all_to_all
split sizes), a rank with no dump, and real torch 2.13 gloo dumps (missing rank, sub-group wait chain, rooted
and uneven collectives) recorded by tests/triage/fr_job.py. The cases live in tests/triage/fr_cases.py;
benchmarks/fr_cases.py scores them against torchfrtrace."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from diag.triage.analysis import triage
from diag.triage.flight_recorder import load_dump
from diag.triage.sources import read_fr_dir
from tests.triage.fr_cases import FIXTURES, all_cases, gloo_cases

CASES = all_cases()


def _judge(case, tmp_path: Path):
    case.write(tmp_path)
    return triage(read_fr_dir(tmp_path))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_flight_recorder_case_gets_its_verdict_and_culprits(case, tmp_path):
    verdict = _judge(case, tmp_path)
    assert verdict.verdict in case.verdicts, verdict.evidence
    if case.culprits is not None:
        assert verdict.culprit_ranks == case.culprits, verdict.evidence


def test_cases_cover_every_source_and_kind():
    """The suite holds what the issue counts: upstream's cases, the NCCL hard cases and real gloo runs."""
    sources = {c.source for c in CASES}
    assert sources == {"pytorch test_fr_analysis.py", "issue 29", "real gloo job"}
    runs = [c.name for c in gloo_cases()]
    assert sum("missing_rank" in n for n in runs) >= 6 and sum("subgroup_chain" in n for n in runs) >= 6
    assert any("rooted" in n for n in runs)


def test_gloo_sub_group_members_are_taken_from_the_dumps():
    """gloo's pg_config names only the default group: the sub-group's members come from the ranks that list it."""
    run = next(p for p in sorted(FIXTURES.glob("gloo_subgroup_chain_*")))
    raw = pickle.loads((run / "fr_rank_1").read_bytes())
    assert set(raw["pg_config"]) == {""}  # what makes this case hard: no members of group 1 anywhere
    data = read_fr_dir(run)
    assert data.pg_ranks["1"] == [1, 2]
    assert any("members of process groups 1" in note for note in data.notes)


def test_all_to_all_split_sizes_of_newer_dumps_are_read(tmp_path):
    case = next(c for c in CASES if "expects half" in c.name)
    case.write(tmp_path)
    dump = load_dump(tmp_path / "nccl_trace_rank_1")
    last = dump.entries[-1]
    assert dump.version == "2.11" and last.input_split_sizes == (4, 8, 12) and last.output_split_sizes == (4, 4, 4)


def test_send_and_recv_peers_are_parsed_as_group_ranks(tmp_path):
    case = next(c for c in CASES if c.name == "nccl: send/recv matched")
    case.write(tmp_path)
    send = next(e for e in load_dump(tmp_path / "nccl_trace_rank_0").entries if e.is_p2p)
    recv = next(e for e in load_dump(tmp_path / "nccl_trace_rank_1").entries if e.is_p2p)
    assert (send.op, send.src, send.dst) == ("send", 0, 1)
    assert (recv.op, recv.src, recv.dst) == ("recv", 0, 1)


def test_a_wrapped_ring_buffer_is_said_and_its_missing_rank_still_found(tmp_path):
    """TORCH_FR_BUFFER_SIZE bounds the ring: a dump whose oldest entry is not record 0 lost the ones before it."""
    case = next(c for c in CASES if c.name == "nccl: rank 2 never issued the all_reduce")
    case.write(tmp_path)
    for rank in range(3):
        path = tmp_path / f"nccl_trace_rank_{rank}"
        dump = pickle.loads(path.read_bytes())
        dump["entries"] = dump["entries"][1:]  # as after a wrap: the first all_reduce was overwritten
        path.write_bytes(pickle.dumps(dump))
    data = read_fr_dir(tmp_path)
    assert any(note.startswith("ring buffer wrapped") and "rank 0: 1" in note for note in data.notes)
    verdict = triage(data)
    assert (verdict.verdict, verdict.culprit_ranks) == ("missing_ranks", [2])
