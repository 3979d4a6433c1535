"""The slow-link finding on a real gloo job (tests/analysis/slow_link_job.py): 4 ranks, a process group per pair
of ranks made with dist.new_group, rank 3's all-reduces slowed down inside the call. diag names rank 3 from the
collectives' timing alone, in the JSON report and in the text view's communication section."""

from __future__ import annotations

from pathlib import Path

import pytest

from diag.launch import run_ranks
from tests.analysis.helpers import cli_json, run_cli

JOB = Path(__file__).resolve().parents[2] / "analysis" / "slow_link_job.py"
WORLD, STEPS, SLOW_RANK, DELAY_MS = 4, 10, 3, 40.0


@pytest.fixture(scope="module")
def slow_link_run(tmp_path_factory) -> Path:
    trace_dir = tmp_path_factory.mktemp("slow-link")
    results = run_ranks([str(JOB), str(trace_dir), str(STEPS), str(SLOW_RANK), str(DELAY_MS)], WORLD, timeout_s=300)
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    return trace_dir


@pytest.mark.slow
def test_real_gloo_job_slow_rank_named_from_its_groups(slow_link_run):
    report = cli_json(slow_link_run)
    links = report["links"]
    assert len(links["groups"]) == 6  # every pair of the 4 ranks
    through_3 = [g for g in links["groups"] if SLOW_RANK in g["ranks"]]
    # the delay is 40 ms in transfers of a few ms: well below the 0.6 threshold (this shared 2-core machine can
    # make another group's transfers a few times slower in a run: such a group is slow too, but not the suspect).
    # A group's transfer is its shortest duration: the peer that came a few ms after rank 3 began its delay waited
    # less than the whole delay.
    shown = [(g["ranks"], g["speed_ratio"], g["transfer_p50_us"]) for g in links["groups"]]
    assert all(g["slow"] and g["speed_ratio"] < 0.35 and g["transfer_p50_us"] > DELAY_MS * 500 for g in through_3), (
        shown
    )
    suspect = links["suspects"][0]
    assert (suspect["kind"], suspect["name"], suspect["groups_including"]) == ("rank", "rank 3", 3)
    assert set(suspect["slow_groups"]) == {g["pg"] for g in through_3}
    assert not [s for s in links["suspects"] if s["kind"] == "host"]  # the one host is in every group
    (finding,) = [f for f in report["findings"] if f["kind"] == "slow_link"]
    assert finding["ranks"] == [SLOW_RANK] and "rank 3" in finding["title"]
    assert finding["time_lost_per_step_s"] > 0.5 * 3 * DELAY_MS / 1e3


@pytest.mark.slow
def test_text_view_shows_the_slow_link_in_the_communication_section(slow_link_run):
    result = run_cli(slow_link_run, "--no-cache")
    assert result.exit_code == 0, result.output
    section = result.output.split("Communication", 1)[1]
    assert "Slow links" in section and "rank 3" in section


if __name__ == "__main__":  # print the groups of a few runs, to see the spread on this machine
    import json
    import sys
    import tempfile

    for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
        with tempfile.TemporaryDirectory() as tmp:
            run_ranks([str(JOB), tmp, str(STEPS), str(SLOW_RANK), str(DELAY_MS)], WORLD, timeout_s=300)
            links = cli_json(Path(tmp))["links"]
            print(json.dumps([(g["ranks"], round(g["speed_ratio"], 3), g["transfer_p50_us"]) for g in links["groups"]]))
