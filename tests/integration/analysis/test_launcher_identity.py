"""The run id is the launcher's job (with its restarts), and `diag analyze` shows the launcher and the job.

Each case runs a real 2-rank gloo job with the environment its launcher or operator gives a process (the
variables are set by hand: there is no Slurm or Kubernetes here); every other launcher's variables are
emptied so that the machine's own environment cannot leak in."""

from __future__ import annotations

import json

import pytest

from diag.launch import run_ranks
from tests.analysis.helpers import PLANTED_JOB, cli_json, run_cli

LAUNCHER_VARIABLES = (
    "SLURM_JOB_ID",
    "SLURM_JOB_NAME",
    "SLURM_RESTART_COUNT",
    "KUBERNETES_SERVICE_HOST",
    "JOBSET_NAME",
    "JOBSET_RESTART_ATTEMPT",
    "PET_RDZV_ENDPOINT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "DIAG_RUN_ID",
)

CASES = {
    "slurm_requeued": (
        {"SLURM_JOB_ID": "7723001", "SLURM_JOB_NAME": "llama-pretrain", "SLURM_RESTART_COUNT": "2"},
        "7723001-requeue2",
        {"scheduler": "slurm", "job_id": "7723001", "job_name": "llama-pretrain", "restarts": {"slurm_requeue": 2}},
        "job: slurm 7723001 (llama-pretrain), slurm requeue 2",
    ),
    "slurm_with_torchrun_inside": (
        {"SLURM_JOB_ID": "88", "TORCHELASTIC_RUN_ID": "88", "TORCHELASTIC_RESTART_COUNT": "1"},
        "88-restart1",
        {"scheduler": "slurm", "job_id": "88", "job_name": None, "restarts": {"torchelastic_restart": 1}},
        "job: slurm 88, torchelastic restart 1",
    ),
    "kubernetes_jobset": (
        {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "JOBSET_NAME": "bert-ft", "JOBSET_RESTART_ATTEMPT": "1"},
        "bert-ft-attempt1",
        {"scheduler": "kubernetes", "job_id": "bert-ft", "job_name": "bert-ft", "restarts": {"jobset_restart": 1}},
        "job: kubernetes bert-ft, jobset restart 1",
    ),
    "kubeflow_elastic_pytorchjob": (
        {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "PET_RDZV_ENDPOINT": "resnet-elastic-worker-0:23456"},
        "resnet-elastic",
        {"scheduler": "kubernetes", "job_id": "resnet-elastic", "job_name": "resnet-elastic", "restarts": {}},
        "job: kubernetes resnet-elastic",
    ),
    "torchelastic": (
        {"TORCHELASTIC_RUN_ID": "c0ffee42"},
        "c0ffee42",
        {"scheduler": "torchelastic", "job_id": "c0ffee42", "job_name": None, "restarts": {}},
        "job: torchelastic c0ffee42",
    ),
}


def run_with_env(trace_dir, env: dict) -> None:
    full = {name: "" for name in LAUNCHER_VARIABLES} | env
    results = run_ranks([str(PLANTED_JOB), str(trace_dir), "4", "1", "none", "0"], 2, env=full, timeout_s=300)
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.parametrize("case", list(CASES))
def test_run_id_and_job_come_from_the_launcher(tmp_path, case):
    env, run_id, job, text_line = CASES[case]
    run_with_env(tmp_path, env)
    for rank in (0, 1):
        manifest = json.loads((tmp_path / f"rank{rank:05d}" / "manifest.json").read_text())
        assert (manifest["run_id"], manifest["job"], manifest["launcher"]) == (run_id, job, "torchrun")
    run = cli_json(tmp_path)["run"]
    assert (run["run_id"], run["job"], run["launcher"]) == (run_id, job, "torchrun")
    assert run["ranks_found"] == [0, 1]
    text = run_cli(tmp_path, "--no-cache")
    assert text.exit_code == 0 and f"launcher: torchrun  {text_line}" in text.stdout


def test_user_run_id_wins_and_no_launcher_means_no_job(tmp_path):
    run_with_env(tmp_path / "user", {"SLURM_JOB_ID": "5", "DIAG_RUN_ID": "my-experiment-3"})
    run = cli_json(tmp_path / "user")["run"]
    assert run["run_id"] == "my-experiment-3" and run["job"]["job_id"] == "5"
    run_with_env(tmp_path / "bare", {})
    run = cli_json(tmp_path / "bare")["run"]
    assert run["job"] is None and run["run_id"] and run["launcher"] == "torchrun"  # rank 0 chose a random id
