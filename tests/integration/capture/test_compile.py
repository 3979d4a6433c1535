"""diag under torch.compile: no graph break and no recompilation of its own, measured with dynamo's counters
against the same job without diag, and the steps (with the phases docs/frameworks.md promises) still recorded.

Real compilation on CPU with the ``aot_eager`` backend (tests/jobs/compile_job.py says why not inductor)."""

import importlib.util
import json

import pytest

import diag
from diag.launch import run_ranks
from tests.conftest import JOBS, requires_gpu

STEPS = 3

_spec = importlib.util.spec_from_file_location("compile_job", JOBS / "compile_job.py")
compile_job = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compile_job)


def _counts(result: dict) -> tuple:
    keys = ("graph_breaks", "unique_graphs", "recompiles", "logged_graph_breaks", "logged_recompiles")
    return tuple(result[key] for key in keys)


def _assert_steps_recorded(trace_dir, phases, ranks=(0,)):
    steps = diag.load(trace_dir).steps
    for rank in ranks:
        mine = steps[steps["rank"] == rank]
        assert sorted(mine["step"]) == list(range(STEPS)), mine
        assert (mine["duration_us"] > 0).all()
        for phase in phases:
            assert (mine[f"{phase}_us"] > 0).all(), (phase, mine)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("wrap", "case"),
    [
        ("ddp", "compile_then_instrument"),
        pytest.param(
            "ddp",
            "instrument_then_compile",
            # measured: 4 graph breaks a rank with diag against 3 without (7 before hooks were made compile-safe);
            # the hooks on the DDP module are traced into torch.compile(ddp_model)'s region there
            marks=pytest.mark.xfail(strict=True, reason="one graph break a rank remains: instrument after compiling"),
        ),
        # the order docs/api.md gives: fully_shard, then torch.compile, then diag.instrument
        ("fsdp2", "compile_then_instrument"),
        # torchtitan's: every block compiled, then fully_shard, then diag.instrument
        ("fsdp2", "per_block"),
    ],
)
def test_gloo_job_under_compile_has_no_graph_break_from_diag(tmp_path, wrap, case):
    def counts_of(with_diag: bool) -> list[tuple]:
        trace_dir = tmp_path / ("diag" if with_diag else "plain")
        argv = [str(JOBS / "compile_job.py"), case, "1" if with_diag else "0", str(trace_dir), str(STEPS), wrap]
        results = run_ranks(argv, 2, timeout_s=600)
        counts = []
        for result in results:
            assert result.returncode == 0, result.stderr[-3000:]
            report = json.loads(result.stdout.strip().splitlines()[-1])
            assert not any("perf_counter" in reason for reason in report["graph_break_reasons"]), report
            counts.append(_counts(report))
        return counts

    assert counts_of(True) == counts_of(False)
    _assert_steps_recorded(tmp_path / "diag", ("forward", "backward", "optimizer"), ranks=(0, 1))


TIMED_PHASES = {
    "compile_then_instrument": ("forward", "backward", "optimizer"),
    "instrument_then_compile": ("forward", "backward", "optimizer"),
    "module_compile": ("forward", "backward", "optimizer"),
    "per_block": ("forward", "backward", "optimizer"),
    "compiled_optimizer_step": ("forward", "backward"),
    "compiled_autograd": ("forward", "backward", "optimizer"),
    "compiled_train_step": ("backward",),
    "reduce_overhead": ("forward", "backward", "optimizer"),
}


@pytest.mark.parametrize("case", compile_job.CASES)
def test_diag_adds_no_graph_break_or_recompilation_under_compile(tmp_path, case):
    plain = compile_job.run_case(case, False, str(tmp_path / "plain"), STEPS)
    instrumented = compile_job.run_case(case, True, str(tmp_path / "diag"), STEPS)
    assert _counts(instrumented) == _counts(plain), (plain, instrumented)
    assert not any("perf_counter" in reason for reason in instrumented["graph_break_reasons"])
    _assert_steps_recorded(tmp_path / "diag", TIMED_PHASES[case])


@requires_gpu
@pytest.mark.parametrize("case", compile_job.CUDA_CASES)
def test_on_cuda_diag_adds_no_graph_break_or_recompilation_under_compile(tmp_path, monkeypatch, case):
    """The same on a GPU, and compile's CUDA graphs (``mode="reduce-overhead"``): the graphs are replayed with
    diag's hooks in place, and every step and phase is still timed."""
    monkeypatch.setattr(compile_job, "DEVICE", "cuda")
    plain = compile_job.run_case(case, False, str(tmp_path / "plain"), STEPS)
    instrumented = compile_job.run_case(case, True, str(tmp_path / "diag"), STEPS)
    assert _counts(instrumented) == _counts(plain), (plain, instrumented)
    _assert_steps_recorded(tmp_path / "diag", TIMED_PHASES[case])
