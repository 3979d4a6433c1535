"""What a person at a terminal sees, and what a pipe or a file gets instead: the progress bar (diag/progress.py)
on stderr only when it is a terminal and not --quiet; colour of the severities and of triage's verdict
(diag/views/colour.py) only on a terminal, never with NO_COLOR or when redirected. A real pseudo-terminal
(pty) stands for the person's terminal."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import threading
from pathlib import Path

import click
import pytest

from tests.analysis.helpers import make_trace, synthetic
from tests.conftest import REPO

SAMPLES = REPO / "sample_traces"
ESC = "\x1b["


def run_diag(args, stdout_tty: bool = False, stderr_tty: bool = False, env: dict | None = None):
    """(returncode, stdout, stderr) of ``python -m diag ARGS``, each stream a pty or a pipe as asked."""
    fds, readers, outputs = {}, [], {"stdout": b"", "stderr": b""}
    for name, tty in (("stdout", stdout_tty), ("stderr", stderr_tty)):
        if tty:
            master, slave = pty.openpty()
            fds[name] = (master, slave)
    environment = {**os.environ, "PYTHONPATH": str(REPO), "TERM": "xterm-256color"}
    environment.pop("NO_COLOR", None)
    environment.update(env or {})
    proc = subprocess.Popen(
        [sys.executable, "-m", "diag", *map(str, args)],
        stdout=fds["stdout"][1] if "stdout" in fds else subprocess.PIPE,
        stderr=fds["stderr"][1] if "stderr" in fds else subprocess.PIPE,
        cwd=REPO,
        env=environment,
    )

    def drain(name, master):
        chunks = []
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed its side
                break
            if not data:
                break
            chunks.append(data)
        outputs[name] = b"".join(chunks)

    for name, (master, slave) in fds.items():
        os.close(slave)
        readers.append(threading.Thread(target=drain, args=(name, master), daemon=True))
        readers[-1].start()
    piped = {name: getattr(proc, name) for name in ("stdout", "stderr") if name not in fds}
    pipe_readers = []
    for name, stream in piped.items():
        pipe_readers.append(
            threading.Thread(target=lambda n=name, s=stream: outputs.__setitem__(n, s.read()), daemon=True)
        )
        pipe_readers[-1].start()
    returncode = proc.wait(timeout=300)
    for thread in readers + pipe_readers:
        thread.join(timeout=30)
    for master, _ in fds.values():
        os.close(master)
    return returncode, outputs["stdout"].decode(errors="replace"), outputs["stderr"].decode(errors="replace")


@pytest.fixture(scope="module")
def many_ranks(tmp_path_factory) -> Path:
    """80 ranks: above the 64 from which loading draws a bar (and the collectives are reduced rank by rank)."""
    path = tmp_path_factory.mktemp("progress") / "run"
    make_trace(path, 80, 6, plants=synthetic.Plants(), seed=0)
    return path


def test_a_progress_bar_is_drawn_on_a_terminal(many_ranks):
    code, out, err = run_diag(["analyze", many_ranks, "--no-cache", "--fail-on", "never"], stderr_tty=True)
    assert code == 0, err
    assert "loading ranks" in err and "rank/s" in err and "\r" in err
    assert "loading ranks" not in out


def test_nothing_but_the_report_on_a_pipe(many_ranks):
    code, out, err = run_diag(["analyze", many_ranks, "--no-cache", "--fail-on", "never"])
    assert code == 0, err
    assert err == "", err  # no bar, no carriage return in a CI log
    assert "Findings" in out


def test_quiet_draws_no_bar_even_on_a_terminal(many_ranks):
    code, _, err = run_diag(["analyze", many_ranks, "--no-cache", "--fail-on", "never", "-q"], stderr_tty=True)
    assert code == 0, err
    assert "loading ranks" not in err and "\r" not in err


def test_export_draws_its_bar_on_a_terminal_only(many_ranks, tmp_path):
    code, _, err = run_diag(["export", many_ranks, "--perfetto", tmp_path / "a.json"], stderr_tty=True)
    assert code == 0 and "exporting ranks" in err
    code, _, err = run_diag(["export", many_ranks, "--perfetto", tmp_path / "b.json"])
    assert code == 0 and "exporting ranks" not in err and "\r" not in err


# -- colour ------------------------------------------------------------------------------------------------------
def test_severities_are_coloured_on_a_terminal():
    code, out, _ = run_diag(["analyze", SAMPLES / "straggler", "--no-cache"], stdout_tty=True)
    assert code == 1
    assert f"{ESC}31m" in out and "[high]" in out  # red, around the tag
    lines = [line for line in out.splitlines() if "[high]" in line]
    assert lines and all(ESC in line for line in lines)


@pytest.mark.parametrize(
    ("stdout_tty", "env"), [(False, {}), (True, {"NO_COLOR": "1"}), (True, {"TERM": "dumb"})], ids=str
)
def test_no_colour_when_redirected_or_asked_not_to(stdout_tty, env):
    code, out, err = run_diag(["analyze", SAMPLES / "straggler", "--no-cache"], stdout_tty=stdout_tty, env=env)
    assert code == 1
    assert "[high]" in out and ESC not in out and ESC not in err


def test_triage_verdict_coloured_on_a_terminal_only():
    _, out, _ = run_diag(["triage", SAMPLES / "hang"], stdout_tty=True)
    assert out.startswith(click.style("HANG", fg="red", bold=True) + ":")
    _, out, _ = run_diag(["triage", SAMPLES / "straggler"], stdout_tty=True)
    assert out.startswith(click.style("NO PROBLEM FOUND", fg="green", bold=True) + ":")
    _, out, _ = run_diag(["triage", SAMPLES / "hang"])
    assert out.startswith("HANG") and ESC not in out
    _, out, _ = run_diag(["triage", SAMPLES / "hang"], stdout_tty=True, env={"NO_COLOR": "1"})
    assert ESC not in out
