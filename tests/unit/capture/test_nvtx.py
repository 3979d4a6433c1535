"""diag's steps and phases as NVTX ranges (``diag.init(nvtx=True)``).

torch's CPU wheels have no NVTX, so on this machine the real path is the one that turns itself off with one
warning. Which ranges diag emits, and that every one it starts it ends, is checked by recording the calls to
``torch.cuda.nvtx.range_start``/``range_end`` (a stand-in: the real functions cannot run without CUDA); the GPU
test runs the real NVTX functions where a GPU is lent."""

import warnings

import pytest
import torch

import diag
from diag._warn import DiagWarning, reset_for_tests
from diag.trace.loader import load
from tests.conftest import requires_gpu


class RecordedNvtx:
    """Records range_start/range_end calls as the real torch.cuda.nvtx would receive them."""

    def __init__(self):
        self.started: dict[int, str] = {}
        self.ended: list[int] = []
        self.next_id = 1

    def range_start(self, message: str) -> int:
        range_id, self.next_id = self.next_id, self.next_id + 1
        self.started[range_id] = message
        return range_id

    def range_end(self, range_id: int) -> None:
        self.ended.append(range_id)

    def names(self) -> list[str]:
        return list(self.started.values())


def train(steps: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    diag.instrument(model, optimizer)
    for _ in range(steps):
        with diag.step():
            with diag.phase("data"):
                x, y = torch.randn(4, 8), torch.randn(4, 1)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()


def test_nvtx_ranges_name_every_step_and_phase_and_all_end(tmp_path, monkeypatch):
    recorded = RecordedNvtx()
    monkeypatch.setattr(torch.cuda.nvtx, "range_start", recorded.range_start)
    monkeypatch.setattr(torch.cuda.nvtx, "range_end", recorded.range_end)
    session = diag.init(tmp_path, nvtx=True, telemetry=False, watchdog=False)
    assert session.capture_status["nvtx"] == "on"
    train(steps=3)
    diag.finish()
    names = recorded.names()
    assert names[0] == "diag.init"  # the probe that NVTX works
    per_step = ["diag.step {}", "diag.data", "diag.forward", "diag.backward", "diag.optimizer"]
    assert names[1:] == [name.format(step) for step in range(3) for name in per_step]
    assert sorted(recorded.ended) == sorted(recorded.started)  # every range ended, exactly once


def test_nvtx_ranges_end_when_a_step_raises(tmp_path, monkeypatch):
    recorded = RecordedNvtx()
    monkeypatch.setattr(torch.cuda.nvtx, "range_start", recorded.range_start)
    monkeypatch.setattr(torch.cuda.nvtx, "range_end", recorded.range_end)
    session = diag.init(tmp_path, nvtx=True, telemetry=False, watchdog=False)
    with pytest.raises(ValueError), diag.step():
        session.set_phase("forward")  # as the forward hook does; the step raises before it ends
        raise ValueError("bad batch")
    assert sorted(recorded.ended) == sorted(recorded.started)
    diag.finish()


def test_nvtx_on_a_torch_without_nvtx_warns_once_and_capture_goes_on(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this torch has NVTX: the GPU test covers it")
    reset_for_tests()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        session = diag.init(tmp_path, nvtx=True, telemetry=False, watchdog=False)
        train(steps=2)
        diag.finish()
    nvtx_warnings = [w for w in caught if issubclass(w.category, DiagWarning) and "NVTX" in str(w.message)]
    assert len(nvtx_warnings) == 1
    assert session.capture_status["nvtx"].startswith("off")
    assert len(load(tmp_path).steps) == 2


def test_nvtx_is_off_by_default(tmp_path):
    session = diag.init(tmp_path, telemetry=False, watchdog=False)
    assert session.nvtx is None and session.capture_status["nvtx"] == "off"
    diag.finish()


@requires_gpu
def test_real_nvtx_ranges_on_a_gpu(tmp_path):
    session = diag.init(tmp_path, nvtx=True, telemetry=False, watchdog=False)
    assert session.capture_status["nvtx"] == "on"
    model = torch.nn.Linear(64, 64).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    diag.instrument(model, optimizer)
    for _ in range(3):
        with diag.step():
            model(torch.randn(8, 64, device="cuda")).sum().backward()
            optimizer.step()
    diag.finish()
    assert session.nvtx is not None and not session.nvtx._open  # every range it started, ended
    assert len(load(tmp_path).steps) == 3
