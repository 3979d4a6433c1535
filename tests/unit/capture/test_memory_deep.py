"""The opt-in deep memory mode: what is behind a step's memory peak, by module (torch's MemTracker, on CPU here)
and by allocation stack (the CUDA allocator's history: a real run where a GPU is lent, and here the conversion of
a snapshot shaped by hand from torch's documentation, since no GPU exists on this machine)."""

from __future__ import annotations

import json
import re
import warnings

import pytest
import torch
from click.testing import CliRunner

import diag
from diag._warn import DiagWarning, reset_for_tests
from diag.analysis.memory_deep import deep_of
from diag.analysis.report import analyze
from diag.capture.memory_deep import allocation_summary
from diag.cli import main
from diag.trace.schema import MEMORY_DEEP_FILE, MEMORY_DEEP_FORMAT
from tests.conftest import requires_gpu

# tests/jobs/memory_deep_job.py's sizes
IN, WIDE, BATCH, DEEP_STEPS, STEPS = 32, 2048, 64, (2, 3), 5
FLOAT32 = 4


def deep_file(trace_dir, rank: int = 0) -> dict:
    return json.loads((trace_dir / f"rank{rank:05d}" / MEMORY_DEEP_FILE).read_text())


def small_run(trace_dir, steps: int = 4, micro_batches: int = 1, **options):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    diag.init(trace_dir, telemetry=False, watchdog=False, clock_sync=False, **options)
    diag.instrument(model, optimizer)
    for _ in range(steps):
        with diag.step():
            for _ in range(micro_batches):
                model(torch.randn(32, 16)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    diag.finish()


def test_gradient_accumulation_is_tracked_across_the_root_modules_second_forward(tmp_path):
    # torch's MemTracker refuses a root module's second forward in one tracker; diag resets its per-module stats
    with warnings.catch_warnings():
        warnings.simplefilter("error", DiagWarning)
        small_run(tmp_path, micro_batches=2, memory_deep_steps=(1, 1))
    peak = deep_file(tmp_path)["modules"]
    assert peak["step"] == 1 and peak["top_modules"]
    assert {m["module"] for m in peak["top_modules"]} & {"Sequential.0", "Sequential.1", "Sequential.2"}


def test_environment_variable_chooses_the_steps(tmp_path, monkeypatch):
    monkeypatch.setenv("DIAG_MEMORY_DEEP_STEPS", "2,2")
    small_run(tmp_path)
    assert deep_file(tmp_path)["steps"] == [2, 3]
    manifest = json.loads((tmp_path / "rank00000" / "manifest.json").read_text())
    assert manifest["capture"]["memory_deep"] == "on: steps 2-3"


def test_a_malformed_environment_variable_is_an_error_naming_it_at_init(tmp_path, monkeypatch):
    # a launcher's typo is said at once on every rank, before training starts, as a wrong option is
    monkeypatch.setenv("DIAG_MEMORY_DEEP_STEPS", "two")
    with pytest.raises(ValueError, match="DIAG_MEMORY_DEEP_STEPS='two'"):
        small_run(tmp_path)
    assert not diag.session().enabled and not (tmp_path / "rank00000").exists()


@pytest.mark.parametrize("value", [(3,), (-1, 2), (0, 0), (0, 11), "2,2", (1.0, 2)])
def test_a_wrong_option_is_a_value_error_at_init(tmp_path, value):
    with pytest.raises(ValueError, match="memory_deep_steps"):
        diag.init(tmp_path, memory_deep_steps=value)


def test_off_by_default_without_any_object(tmp_path):
    session = diag.init(tmp_path, telemetry=False, watchdog=False)
    try:
        assert session.memory_deep is None and "memory_deep" not in session.capture_status
    finally:
        diag.finish()


def test_a_tracker_failure_is_one_warning_and_training_goes_on(tmp_path, monkeypatch):
    """No real input makes torch's MemTracker fail on this CPU, so its storage tracking is replaced by one that
    raises: the failure must stop the mode, warn once and leave every step to finish."""
    from torch.distributed._tools.mem_tracker import MemTracker

    def broken(self, reftype, t):
        raise RuntimeError("a storage layout MemTracker does not know")

    reset_for_tests()
    monkeypatch.setattr(MemTracker, "_track", broken)
    with pytest.warns(DiagWarning, match="deep memory mode stopped") as caught:
        small_run(tmp_path, steps=5, memory_deep_steps=(1, 3))
    assert sum("deep memory mode" in str(w.message) for w in caught) == 1
    trace = diag.load(tmp_path)
    assert sorted(trace.steps["step"]) == [0, 1, 2, 3, 4]
    manifest = json.loads((tmp_path / "rank00000" / "manifest.json").read_text())
    assert manifest["finished"] is True
    assert manifest["capture"]["memory_deep"].startswith("off: RuntimeError(")


# -- the CUDA allocator's history ------------------------------------------------------------------------------
def frame(filename: str, line: int, name: str) -> dict:
    return {"filename": filename, "line": line, "name": name}


TORCH_LINEAR = frame("/usr/lib/python3.11/site-packages/torch/nn/modules/linear.py", 125, "forward")
MODEL_43 = frame("/home/user/model.py", 43, "forward")
MODEL_50 = frame("/home/user/model.py", 50, "forward")


def hand_shaped_snapshot() -> dict:
    """A ``torch.cuda.memory._snapshot()`` result, written by hand from the ``Snapshot``/``TraceEntry`` TypedDicts
    in ``_snapshot``'s docstring (torch/cuda/memory.py, torch 2.13) and the ``time_us`` each entry gets in
    torch/csrc/cuda/Module.cpp: device 0's history, innermost frame first as torch/cuda/_memory_viz.py reads it.

    Before recording 1,000,000 bytes were allocated. A (4096) and B (8192) are allocated, A freed, 500,000 bytes
    allocated before recording are freed, C (8192, B's stack) and D (600,000) allocated, D freed, then an OOM.
    The peak is at D: 1,000,000 + 4096 + 8192 - 4096 - 500,000 + 8192 + 600,000 = 1,116,384."""
    entry = dict(stream=0, frames=[])
    return {
        "segments": [],
        "device_traces": [
            [
                {**entry, "action": "alloc", "addr": 0xA, "size": 4096, "time_us": 100, "frames": [TORCH_LINEAR]},
                {
                    **entry,
                    "action": "alloc",
                    "addr": 0xB,
                    "size": 8192,
                    "time_us": 110,
                    "frames": [TORCH_LINEAR, MODEL_43],
                },
                {**entry, "action": "free_requested", "addr": 0xA, "size": 4096, "time_us": 120},
                {**entry, "action": "free_completed", "addr": 0xA, "size": 4096, "time_us": 121},
                {**entry, "action": "free_completed", "addr": 0xDEAD, "size": 500_000, "time_us": 130},
                {
                    **entry,
                    "action": "alloc",
                    "addr": 0xC,
                    "size": 8192,
                    "time_us": 140,
                    "frames": [TORCH_LINEAR, MODEL_43],
                },
                {**entry, "action": "alloc", "addr": 0xD, "size": 600_000, "time_us": 150, "frames": [MODEL_50]},
                {**entry, "action": "free_completed", "addr": 0xD, "size": 600_000, "time_us": 160},
                {**entry, "action": "oom", "device_free": 123, "size": 2**40, "time_us": 170, "frames": [MODEL_50]},
            ]
        ],
    }


def test_allocator_history_is_replayed_to_its_peak_and_grouped_by_stack():
    summary = allocation_summary(hand_shaped_snapshot(), 0, 1_000_000, {5: (95, 145), 6: (146, 200)})
    assert summary["peak_bytes"] == 1_116_384 and summary["peak_step"] == 6
    assert summary["before_recording_bytes"] == 500_000
    tops = summary["top_allocations"]
    assert [(t["bytes"], t["count"]) for t in tops] == [(600_000, 1), (16_384, 2)]
    assert sum(t["bytes"] for t in tops) + summary["before_recording_bytes"] == summary["peak_bytes"]
    assert summary["ooms"] == [{"bytes": 2**40, "device_free_bytes": 123, "frames": [MODEL_50]}]
    assert summary["entries"] == 9 and summary["truncated"] is False
    # the analysis names the user's line, not torch's Linear, as where the memory came from
    deep = deep_of(0, {"format": MEMORY_DEEP_FORMAT, "steps": [5, 6], "modules": None, "allocations": summary})
    assert deep.allocation_peak_bytes == 1_116_384
    assert [a.site for a in deep.top_allocations] == ["/home/user/model.py:50 in forward"] * 1 + [
        "/home/user/model.py:43 in forward"
    ]
    assert deep.oom_requests == [2**40] and deep.skipped_entries == 0


def test_trace_times_in_nanoseconds_still_find_their_step():
    """c10 documents time_us as epoch microseconds; should a torch write nanoseconds, the step is still found."""
    snapshot = hand_shaped_snapshot()
    start_us = 1_764_000_000_000_000  # 2025-11-24 in microseconds
    for entry in snapshot["device_traces"][0]:
        entry["time_us"] = (start_us + entry["time_us"]) * 1000
    windows = {5: (start_us + 95, start_us + 145), 6: (start_us + 146, start_us + 200)}
    assert allocation_summary(snapshot, 0, 1_000_000, windows)["peak_step"] == 6


def test_a_history_without_the_devices_trace_has_only_what_was_there_before():
    summary = allocation_summary({"segments": [], "device_traces": []}, 0, 2048, {})
    assert summary["peak_bytes"] == 2048 and summary["top_allocations"] == [] and summary["peak_step"] is None


@requires_gpu
@pytest.mark.gpu
def test_cuda_run_names_the_stack_behind_the_allocators_peak(tmp_path):
    """A real CUDA step: the largest allocation alive at the peak is this test's own big activation."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 8192), torch.nn.ReLU(), torch.nn.Linear(8192, 1)).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    diag.init(tmp_path, telemetry=False, watchdog=False, memory_deep_steps=(1, 2))
    diag.instrument(model, optimizer)
    for _ in range(4):
        with diag.step():
            x = torch.randn(4096, 1024, device="cuda")
            model(x).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    diag.finish()
    data = deep_file(tmp_path)
    allocations = data["allocations"]
    assert allocations is not None and allocations["peak_step"] in (1, 2) and allocations["entries"] > 0
    assert allocations["peak_bytes"] >= 4096 * 8192 * 4  # the ReLU's output alone
    assert any(
        f["filename"].endswith("test_memory_deep.py") for t in allocations["top_allocations"] for f in t["frames"]
    )
    assert data["modules"]["top_modules"][0]["activation_bytes"] >= 4096 * 8192 * 4
    assert not torch._C._cuda_isHistoryEnabled()  # stopped after the steps


# -- reading the side file back ------------------------------------------------------------------------------
def test_the_recorded_h200_run_shows_each_peak_stack_from_the_users_frame():
    """sample_traces/straggler-h200 was recorded on an H200 with the deep mode on at steps 5-6 (CUDA's allocator
    history): the stacks alive at the allocator's peak begin with the dispatcher's and MemTracker's frames;
    the report names the user's line and prints each stack from it."""
    from tests.conftest import REPO

    run = REPO / "sample_traces" / "straggler-h200"
    deep = deep_of(0, json.loads((run / "rank00000" / MEMORY_DEEP_FILE).read_text()))
    assert deep.device == "cuda:0" and deep.steps == [5, 6] and deep.top_allocations
    top = deep.top_allocations[0]
    frames, hidden = top.frames_from_site()
    assert hidden > 0 and "torch" in top.frames[0] and frames[0] == top.site
    assert re.search(r"make_samples\.py:\d+ in busy_compute$", top.site)
    text = CliRunner().invoke(main, ["analyze", str(run), "--no-cache"]).output
    assert f"stack (innermost first, below {hidden} frame(s) inside torch):\n    {top.site}\n" in text


def test_a_pickle_or_foreign_json_in_its_place_is_skipped_with_its_reason_and_never_run(tmp_path):
    import pickle

    small_run(tmp_path, memory_deep_steps=(1, 1))
    path = tmp_path / "rank00000" / MEMORY_DEEP_FILE
    marker = tmp_path / "executed"
    # a pickle that would create a file if anything unpickled it
    path.write_bytes(pickle.dumps(_Creates(str(marker))))
    trace = diag.load(tmp_path)
    assert trace.memory_deep == {} and not marker.exists()
    assert any(s.path == str(path) and "unreadable" in s.reason for s in trace.skipped)
    path.write_text(json.dumps({"format": "something else", "modules": {}}))
    trace = diag.load(tmp_path)
    assert trace.memory_deep == {} and any("not a diag.memory_deep/1 object" in s.reason for s in trace.skipped)
    assert analyze(trace).to_dict()["memory"].get("deep") is None


class _Creates:
    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_malformed_entries_are_counted_and_the_rest_is_read(tmp_path):
    small_run(tmp_path, memory_deep_steps=(1, 1))
    path = tmp_path / "rank00000" / MEMORY_DEEP_FILE
    data = json.loads(path.read_text())
    good = len(data["modules"]["top_modules"])
    data["modules"]["top_modules"] += [
        {"module": 3, "activation_bytes": 1},
        "x",
        {"module": "m", "activation_bytes": -1},
    ]
    data["allocations"] = {
        "peak_bytes": "big",
        "top_allocations": [{"bytes": 10, "frames": [{"line": 1}]}, {"bytes": None}],
    }
    path.write_text(json.dumps(data))
    (deep,) = analyze(diag.load(tmp_path)).memory.deep
    assert len(deep.top_modules) == good and deep.allocation_peak_bytes is None
    assert [a.bytes for a in deep.top_allocations] == [10] and deep.top_allocations[0].frames == []
    assert deep.skipped_entries == 3 + 1 + 1  # three modules, one frame, one allocation


class _WideThenHuge(torch.nn.Module):
    """Linear(16, 512), ReLU, Linear(512, 1); with ``fail`` set its forward asks the CPU allocator for 2**50
    bytes after the ReLU: a real allocator failure."""

    def __init__(self):
        super().__init__()
        self.wide, self.act, self.head = torch.nn.Linear(16, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1)
        self.fail = False

    def forward(self, x):
        hidden = self.act(self.wide(x))
        if self.fail:
            torch.empty(2**50, dtype=torch.uint8)
        return self.head(hidden)


def test_an_oom_in_a_recorded_step_writes_the_file_and_the_oom_finding_names_the_peak(tmp_path):
    """An OOM in step 2, the second recorded step: the mode writes what it saw up to then, and the oom finding's
    evidence says what was behind the peak (step 1's: the ReLU's 64 x 512 float32 output and its gradient)."""
    torch.manual_seed(0)
    model = _WideThenHuge()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    diag.init(tmp_path, telemetry=False, watchdog=False, clock_sync=False, memory_deep_steps=(1, 3))
    diag.instrument(model, optimizer)
    failed = []
    for step in range(4):
        model.fail = step == 2
        try:
            with diag.step():
                model(torch.randn(64, 16)).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
        except RuntimeError:
            failed.append(step)
    diag.finish()
    assert failed == [2]
    data = deep_file(tmp_path)
    assert data["steps"] == [1, 2] and [p["step"] for p in data["step_peaks"]] == [1, 2]
    report = analyze(diag.load(tmp_path))
    finding = next(f for f in report.findings if f.kind == "oom")
    assert re.search(
        r"rank 0: tensor memory peaked at [\d.]+ KiB in step 1, during the backward", " ".join(finding.evidence)
    )
    relu = 64 * 512 * FLOAT32  # its output (saved for the head's backward), and the gradient it makes
    assert f"_WideThenHuge.act {relu * 2 / 1024:.2f} KiB" in " ".join(finding.evidence)


def test_the_trace_cache_keeps_the_deep_result(tmp_path):
    """A second `diag analyze` with other options reads the trace from the cache: the deep section must survive."""
    from diag.trace.cache import TraceCache

    small_run(tmp_path, memory_deep_steps=(1, 1))
    first, how = TraceCache(tmp_path).load()
    assert how == "loaded+cached" and set(first.memory_deep) == {0}
    second, how = TraceCache(tmp_path).load()
    assert how == "cache" and second.memory_deep == first.memory_deep
    for steps in ("0:4", "1:3"):  # two option sets: the second report is computed from the cached trace
        out = CliRunner().invoke(main, ["analyze", str(tmp_path), "--steps", steps, "--format", "json"]).stdout
        assert json.loads(out)["memory"]["deep"][0]["steps"] == [1]
