"""``diag telemetry``, the node agent, as a real process: its one line where there is no NVML, and the step,
collective and memory metrics of a trace directory (the bundled sample run, a real 3-rank gloo job)."""

import subprocess
import sys
from pathlib import Path

import pytest

import diag
from diag.analysis.peaks import lookup_peak_tflops
from tests.prometheus.helpers import (
    STRAGGLER,
    free_ports,
    no_nvml,
    samples,
    scrape_when_up,
    start_agent,
    stop,
    value,
    values,
)

REPO = Path(__file__).resolve().parents[3]
H100_RUN = REPO / "sample_traces" / "straggler-h100"


@no_nvml
def test_without_nvml_or_trace_dir_it_says_so_in_one_line_and_exits_2():
    agent = start_agent("--prometheus-port", str(free_ports(1)))
    stdout, stderr = agent.communicate(timeout=30)
    assert agent.returncode == 2 and stdout == ""  # nothing to do: an input error (docs/cli.md)
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "no GPU telemetry" in lines[0] and "NVML" in lines[0] and "TRACE_DIR" in lines[0]


@no_nvml
def test_exports_the_ranks_of_a_trace_directory(tmp_path):
    port = free_ports(1)
    agent = start_agent(
        "--prometheus-port", str(port), "--bind", "127.0.0.1", "--interval", "0.2", "--all-hosts", str(STRAGGLER)
    )
    try:
        # memory is the last table the agent folds from this run: once 3 ranks have it, the first read is in
        text = scrape_when_up(agent, port, lambda t: len(values(t, "diag_memory_rss_bytes")) == 3)
    finally:
        stderr = stop(agent)
    assert "no GPU telemetry" in stderr.splitlines()[0]  # one line says NVML is missing, and it goes on
    trace = diag.load(STRAGGLER)
    for rank in trace.ranks_found:
        steps = trace.steps[trace.steps["rank"] == rank]
        labels = {"rank": str(rank), "run": trace.run_id, "host": trace.manifest(rank).host}
        assert value(text, "diag_steps_total", **labels) == len(steps)
        assert value(text, "diag_step_duration_seconds_sum", **labels) == pytest.approx(
            steps["duration_us"].sum() / 1e6
        )
        colls = trace.collectives[trace.collectives["rank"] == rank]
        for (op, pg), group in colls.groupby([colls["op"].astype(str), colls["pg"].astype(str)]):
            assert value(text, "diag_collectives_total", op=op, pg=pg, **labels) == len(group)
            assert value(text, "diag_collective_bytes_total", op=op, pg=pg, **labels) == group["bytes"].sum()
            timed = group["duration_us"].sum() / 1e6
            assert value(text, "diag_collective_seconds_total", op=op, pg=pg, **labels) == pytest.approx(timed)
        memory = trace.memory[trace.memory["rank"] == rank].sort_values("step")
        assert value(text, "diag_memory_rss_bytes", **labels) == memory["rss_bytes"].iloc[-1]
        assert value(text, "diag_model_flops_total", **labels) == trace.manifest(rank).flops_per_step * len(steps)
    # the planted compute straggler, rank 1, is the one that does not wait for the others in communication
    comm_wait = {
        s.labels["rank"]: s.value
        for s in samples(text)
        if s.name == "diag_step_breakdown_seconds_total" and s.labels["part"] == "comm_wait"
    }
    assert min(comm_wait, key=comm_wait.get) == "1"


@no_nvml
def test_gpu_telemetry_from_trace_files_and_mfu_from_the_datasheet_peak():
    port = free_ports(1)
    agent = start_agent(
        "--prometheus-port", str(port), "--bind", "127.0.0.1", "--interval", "0.2", "--all-hosts", str(H100_RUN)
    )
    try:
        text = scrape_when_up(agent, port, lambda t: len(values(t, "diag_gpu_power_limit_watts")) == 3)
    finally:
        stop(agent)
    trace = diag.load(H100_RUN)
    for rank in trace.ranks_found:
        manifest = trace.manifest(rank)
        telemetry = trace.telemetry[trace.telemetry["rank"] == rank].sort_values("time_us")
        (power,) = [
            s for s in samples(text) if s.name == "diag_gpu_power_usage_watts" and s.labels["rank"] == str(rank)
        ]
        assert power.value == pytest.approx(telemetry["power_w"].iloc[-1])
        assert power.labels["model"] == manifest.device_name and power.labels["uuid"].endswith(manifest.gpu_uuid)
        peak = lookup_peak_tflops(manifest.device_name, manifest.dtype).tflops * 1e12  # no peak given: datasheet
        assert value(text, "diag_device_peak_flops", rank=str(rank)) == peak
        steps = trace.steps[trace.steps["rank"] == rank]
        iteration_s = (steps["duration_us"] + steps["data_wait_us"]).sum() / 1e6
        mfu = manifest.flops_per_step * len(steps) / iteration_s / peak  # the agent read every step at once
        assert value(text, "diag_mfu_ratio", rank=str(rank)) == pytest.approx(mfu)


def test_agent_never_imports_torch(tmp_path):
    """The node agent runs beside training, often where torch is not installed: it must not need it."""
    script = (
        "import sys, threading, signal, os\n"
        "from click.testing import CliRunner\n"
        "from diag.cli import main\n"
        "assert CliRunner().invoke(main, ['telemetry', '--help']).exit_code == 0\n"
        # SIGTERM once the agent handles it (on a loaded machine its start can take longer than a fixed delay)
        "def stop():\n"
        "    while signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):\n"
        "        threading.Event().wait(0.05)\n"
        "    threading.Event().wait(1.0)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "threading.Thread(target=stop, daemon=True).start()\n"
        f"r = CliRunner().invoke(main, ['telemetry', '--prometheus-port', '{free_ports(1)}', '--bind', '127.0.0.1',"
        f" '--interval', '0.2', '--all-hosts', r'{STRAGGLER}'])\n"
        "assert r.exit_code == 0, r.output\n"
        "print(sorted(m for m in ('torch', 'pynvml_utils', 'dash') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
