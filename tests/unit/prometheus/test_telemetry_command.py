"""``diag telemetry``, the node agent, as a real process: its one line where there is no NVML, and the step,
collective and memory metrics of a trace directory (the bundled sample run, a real 3-rank gloo job)."""

import diag
from tests.prometheus.helpers import (
    STRAGGLER,
)


def test_only_this_hosts_ranks_by_default(tmp_path):
    """A shared trace directory holds every node's ranks: each node's agent exports its own."""
    import shutil

    trace_dir = tmp_path / "run"
    shutil.copytree(STRAGGLER, trace_dir)
    from diag.commands.telemetry import TraceFollower
    from diag.metrics.prometheus import RowMetrics

    metrics = RowMetrics()
    follower = TraceFollower(trace_dir, metrics, host="not-" + diag.load(trace_dir).manifest(0).host)
    follower.poll()
    assert follower.sources == {} and "--all-hosts" in follower.problem
    follower = TraceFollower(trace_dir, metrics, host=diag.load(trace_dir).manifest(0).host)
    follower.poll()
    assert sorted(follower.sources) == [0, 1, 2]
