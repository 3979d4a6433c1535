import warnings

import diag
from diag._warn import DiagWarning, reset_for_tests
from diag.capture.components import HOOKS, Component, hooks_of
from diag.capture.memory import MemorySampler
from diag.capture.session import COMPONENTS


class Recording(Component):
    def __init__(self, name, calls, fail=False):
        self.name, self.calls, self.fail = name, calls, fail

    def step_begin(self, step):
        self.calls.append((self.name, "step_begin", step))
        if self.fail:
            raise RuntimeError("broken")

    def step_end(self, step, completed):
        self.calls.append((self.name, "step_end", step))

    def stop(self):
        self.calls.append((self.name, "stop"))


def test_begin_hooks_run_in_order_end_hooks_in_reverse_and_a_hook_nobody_overrides_is_empty():
    calls = []
    components = [("a", Recording("a", calls)), ("null", Component()), ("b", Recording("b", calls))]
    for hook in hooks_of(components, "step_begin"):
        hook(3)
    for hook in hooks_of(components, "step_end"):
        hook(3, True)
    for hook in hooks_of(components, "stop"):
        hook()
    assert calls == [
        ("a", "step_begin", 3),
        ("b", "step_begin", 3),
        ("b", "step_end", 3),
        ("a", "step_end", 3),
        ("b", "stop"),
        ("a", "stop"),
    ]
    assert hooks_of(components, "phase_begin") == () and hooks_of(components, "step_recorded") == ()


def test_a_failing_hook_is_one_warning_and_the_other_components_go_on():
    reset_for_tests()
    calls = []
    components = [("broken", Recording("broken", calls, fail=True)), ("fine", Recording("fine", calls))]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(3):
            for hook in hooks_of(components, "step_begin"):
                hook(step)
    assert [c for c in calls if c[0] == "fine"] == [("fine", "step_begin", s) for s in range(3)]
    (warning,) = [w for w in caught if issubclass(w.category, DiagWarning)]
    assert "broken: step timing failed" in str(warning.message)


def test_a_component_that_fails_at_step_end_loses_its_rows_only(tmp_path, monkeypatch):
    reset_for_tests()

    def broken(self, step):
        raise RuntimeError("no memory stats")

    monkeypatch.setattr(MemorySampler, "sample", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        diag.init(tmp_path, telemetry=False, watchdog=False, calibrate_every=1)
        for _ in range(3):
            with diag.step():
                pass
        diag.finish()
    messages = [str(w.message) for w in caught if issubclass(w.category, DiagWarning)]
    assert [m for m in messages if "memory: step recording failed" in m] == [m for m in messages if "memory" in m]
    assert len([m for m in messages if "memory" in m]) == 1
    trace = diag.load(tmp_path)
    assert trace.steps["step"].tolist() == [0, 1, 2] and trace.memory.empty
    assert trace.calibration["step"].tolist() == [-1, 0, 1, 2, 2]  # init, each step, finish


def test_components_that_are_off_are_none_and_cost_no_hooks(tmp_path):
    session = diag.init(
        tmp_path, telemetry=False, watchdog=False, memory=False, collectives=False, calibrate_every=0, nvtx=False
    )
    try:
        assert all(getattr(session, name) is None for name, _ in COMPONENTS)
        assert session.components == [] and all(session._on[hook] == () for hook in HOOKS)
    finally:
        diag.finish()
