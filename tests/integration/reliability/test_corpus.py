"""Every command on every corruption class: no crash (no traceback), no hang, no code run from a pickle, bounded
memory, and the skip named. Each case runs in its own subprocess under RLIMIT_AS and a timeout.

The default run takes a sample of the corpus (every class represented, about two minutes on two cores); the
exhaustive run is marked slow: ``pytest tests/reliability -m slow``."""

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability.corpus import SAMPLED, SENTINEL_NAME, build_cases, make_case

MEMORY_LIMIT_BYTES = 4 << 30
CASE_TIMEOUT_S = 240  # generous: the machine is shared; a hang is forever, not minutes
ROOT = Path(__file__).resolve().parents[3]

# what the output must say for a case: the skip is named, not silent
EXPECTED_NOTES = {
    "cell:steps.csv:int:float": "corrupt rows skipped",
    "cell:steps.csv:int_time:digits20": "corrupt rows skipped",
    "cell:collectives.csv:category:nonutf8": "corrupt rows skipped",
    "cell:memory.csv:int:quote": "corrupt rows skipped",
    "binary_junk_mid_file": "corrupt rows skipped",
    "fifo_manifest": "not a regular file",
    "fifo_steps": "not a regular file",
    "dev_zero_steps": "not a regular file",
    "manifest_deep": "nested deeper",
    "manifest_world_size_huge": "implausible world_size",
    "manifest_peak_zero": "peak_tflops 0 is not a positive number",
    "rank_dir_huge_number": "rank number above",
    "second_run_appended": "step numbers start again",
    "swapped_start_duration": "negative duration or one over 7 days",
    "pickle_self_list": "cycle",
    "pickle_code": "refused",
    "v2_truncated_parquet": "unreadable Parquet segment",
    "v2_junk_in_stream": "damaged Arrow stream segment",
    "v2_random_bytes_segment": "unreadable Parquet segment",
    "v2_wrong_table_segment": "expected version 2 'steps'",
    "v2_fifo_segment": "not a regular file",
    "v2_dev_zero_segment": "not a regular file",
    "kineto_rank_huge": "is not a rank",
    "kineto_rank_negative": "is not a rank",
    "kineto_base_time_text": "is not a time",
    "kineto_device_props_dict": "deviceProperties is a dict",
    "kineto_distributed_info_list": "distributedInfo is a list",
    "kineto_args_deep": "JSON nested deeper than",  # refused before parsing (no MemoryError), the reason named
    "events_odd_values": "event values of the wrong type",
    "events_numbers_as_text": "event values of the wrong type",
    "v2_duplicate_column": "appears more than once",
    "v2_parquet_constant_rows": "more than a trace segment holds",
    "nccl_log_long_prefix": "NCCL log lines not understood",
}
ANALYZE_COMMANDS = ("analyze_text", "analyze_json", "analyze_markdown", "analyze_html", "analyze_cached")


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


def _run(name: str, tmp_path: Path) -> dict:
    case_dir = make_case(name, tmp_path / "case")
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.reliability.corpus", str(case_dir), str(work)],
        capture_output=True,
        text=True,
        timeout=CASE_TIMEOUT_S,
        preexec_fn=_limit_memory,
        cwd=ROOT,
        env=env,
    )
    assert proc.returncode == 0, f"runner died (memory limit?): {proc.stderr[-3000:]}"
    assert not (case_dir / SENTINEL_NAME).exists(), "code from a pickle was executed"
    return json.loads(proc.stdout.splitlines()[-1])


def _check(name: str, results: dict) -> None:
    for command, result in results.items():
        assert not result["crashed"], f"{name}: {command} crashed:\n{result['traceback']}"
        assert "Traceback" not in result["output"], f"{name}: {command} printed a traceback"
        assert result["exit_code"] in (0, 1, 2), f"{name}: {command} exit {result['exit_code']}"
        # a name or message from a file reaches the terminal printable: no escape sequence, no bell
        assert "\x1b" not in result["output"] and "\x07" not in result["output"], f"{name}: {command} printed ESC"
    note = EXPECTED_NOTES.get(name)
    if note is not None:
        said = " ".join(results[c]["output"] for c in (*ANALYZE_COMMANDS, "triage", "export"))
        assert note in said, f"{name}: the skip is not named ({note!r})"


@pytest.mark.parametrize("name", SAMPLED)
def test_corpus_sample(name, tmp_path):
    _check(name, _run(name, tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in build_cases() if n not in SAMPLED])
def test_corpus_exhaustive(name, tmp_path):
    _check(name, _run(name, tmp_path))
