"""Real multi-rank jobs (gloo, separate processes) checked against what they really did: the model's
parameter sizes, the list of explicit calls, and PyTorch's own Flight Recorder."""

import json

import pandas as pd
import pytest

import diag
from diag.launch import run_ranks
from tests.conftest import JOBS

STEPS = 4
WORLD = 2


def run_job(tmp_path_factory, mode: str, world: int = WORLD):
    trace_dir = tmp_path_factory.mktemp(mode)
    results = run_ranks(
        [str(JOBS / "capture_job.py"), str(trace_dir), mode, str(STEPS)],
        world,
        env={"TORCH_FR_BUFFER_SIZE": "4000"},
        timeout_s=180,
    )
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    truths = {r: json.loads((trace_dir / "truth" / f"rank{r}.json").read_text()) for r in range(world)}
    return diag.load(trace_dir), truths


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    return run_job(tmp_path_factory, "ddp")


@pytest.fixture(scope="module")
def ddp_hook_run(tmp_path_factory):
    return run_job(tmp_path_factory, "ddp_hook")


@pytest.fixture(params=["flight_recorder", "hook"])
def ddp_buckets_run(request, ddp_run, ddp_hook_run):
    """DDP's buckets recorded both ways: from Flight Recorder (the default on gloo) and through the hook."""
    return request.param, ddp_run if request.param == "flight_recorder" else ddp_hook_run


@pytest.fixture(scope="module")
def explicit_run(tmp_path_factory):
    return run_job(tmp_path_factory, "explicit")


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    return run_job(tmp_path_factory, "fsdp")


def fr_collectives_after_init(truth):
    """Flight Recorder's entries issued after diag.init, as (pg, seq, op, bytes) in issue order."""
    element_bytes = {"Float": 4, "Double": 8, "BFloat16": 2, "Half": 2, "Int": 4, "Long": 8}
    entries = []
    for entry in truth["fr_entries"]:
        if entry["is_p2p"] or entry["time_created_ns"] < truth["init_done_ns"]:
            continue
        numel = sum(_prod(size) for size in entry["sizes"])
        nbytes = numel * element_bytes[entry["dtypes"][0]] if entry["dtypes"] else 0
        entries.append((entry["pg"], entry["seq"], entry["name"].split(":")[1], nbytes))
    return sorted(entries)


def _prod(values):
    out = 1
    for v in values:
        out *= v
    return out


def test_every_rank_records_every_step_with_phases(ddp_run):
    trace, _ = ddp_run
    assert trace.ranks_found == [0, 1] and trace.ranks_missing == [] and trace.skipped == []
    for rank in range(WORLD):
        steps = trace.steps[trace.steps["rank"] == rank].sort_values("step")
        assert steps["step"].tolist() == list(range(STEPS))
        assert (steps["samples"] == 16).all()
        assert (steps["forward_us"] > 0).all() and (steps["backward_us"] > 0).all()
        assert (steps["optimizer_us"] > 0).all()
        inner = steps["forward_us"] + steps["backward_us"] + steps["optimizer_us"]
        assert (inner <= steps["duration_us"] + 5).all()  # phases happen inside the step (rounding: 1 us each)
        phases = trace.phases[trace.phases["rank"] == rank]
        assert phases["name"].astype(str).tolist() == ["compute"] * STEPS
        memory = trace.memory[trace.memory["rank"] == rank]
        assert memory["step"].tolist() == list(range(STEPS)) and (memory["rss_bytes"] > 10 * 2**20).all()


def test_ddp_buckets_recorded_with_the_gradient_bytes(ddp_buckets_run):
    mode, (trace, truths) = ddp_buckets_run
    for rank in range(WORLD):
        colls = trace.collectives[trace.collectives["rank"] == rank]
        ddp = colls[colls["source"] == "ddp"]
        per_step = ddp.groupby("step")["bytes"].sum()
        # every step all-reduces every gradient exactly once, whatever the bucketing
        assert per_step.index.tolist() == list(range(STEPS))
        assert (per_step == truths[rank]["param_bytes"]).all()
        assert (ddp["op"] == "all_reduce").all() and (ddp["blocking"] == 0).all()
        assert ddp["seq"].is_unique and (ddp["dtype"] == "float32").all()
        steps = trace.steps[trace.steps["rank"] == rank]
        if mode == "hook":
            assert ddp["duration_us"].notna().all()
        else:  # gloo's Flight Recorder has no completion times; the step's exposed wait is timed instead
            assert ddp["duration_us"].isna().all()
            assert (steps["comm_wait_us"] > 0).all()
        assert (steps["comm_wait_us"] <= steps["backward_us"]).all()  # DDP waits inside the backward


def test_ddp_collectives_match_flight_recorder(ddp_buckets_run):
    _, (trace, truths) = ddp_buckets_run
    for rank in range(WORLD):
        colls = trace.collectives[trace.collectives["rank"] == rank]
        ours = sorted(zip(colls["pg"].astype(str), colls["seq"], colls["op"].astype(str), colls["bytes"]))
        assert ours == fr_collectives_after_init(truths[rank])


def test_explicit_collectives_recorded_in_order_with_sizes_and_peers(explicit_run):
    trace, truths = explicit_run
    for rank in range(WORLD):
        colls = trace.collectives[trace.collectives["rank"] == rank].sort_values("start_us", kind="stable")
        peers = [None if pd.isna(peer) else int(peer) for peer in colls["peer"]]
        ours = list(zip(colls["op"].astype(str), colls["bytes"], peers))
        assert ours == [tuple(op) for op in truths[rank]["explicit_ops"]]
        # gloo's isend/irecv give no future to time them by: those alone have no duration
        untimed = colls[colls["duration_us"].isna()]
        assert (untimed["bytes"] == 24).all() and len(untimed) == 2 * STEPS
        # per-step attribution: 10 explicit ops per step
        assert colls.groupby("step").size().tolist() == [10] * STEPS
        asynchronous = colls[(colls["blocking"] == 0) & ~colls["op"].isin(["send", "recv"])]
        assert asynchronous["dtype"].astype(str).tolist() == ["bfloat16"] * STEPS


def test_explicit_collective_sequence_numbers_match_flight_recorder(explicit_run):
    trace, truths = explicit_run
    for rank in range(WORLD):
        colls = trace.collectives[(trace.collectives["rank"] == rank) & ~trace.collectives["op"].isin(["send", "recv"])]
        ours = sorted(zip(colls["pg"].astype(str), colls["seq"]))
        theirs = [(pg, seq) for pg, seq, _, _ in fr_collectives_after_init(truths[rank])]
        assert ours == theirs
        p2p = trace.collectives[(trace.collectives["rank"] == rank) & trace.collectives["op"].isin(["send", "recv"])]
        assert sorted(p2p["seq"].tolist()) == list(range(1, 4 * STEPS + 1))


def test_same_collective_has_same_sequence_number_on_every_rank(explicit_run):
    trace, _ = explicit_run
    colls = trace.collectives[~trace.collectives["op"].isin(["send", "recv"])]
    by_seq = colls.groupby("seq").agg(ranks=("rank", "nunique"), ops=("op", "nunique"), sizes=("bytes", "nunique"))
    assert (by_seq["ranks"] == WORLD).all() and (by_seq["ops"] == 1).all() and (by_seq["sizes"] == 1).all()


def test_fsdp2_all_gathers_and_reduce_scatters_recorded(fsdp_run):
    trace, truths = fsdp_run
    for rank in range(WORLD):
        colls = trace.collectives[trace.collectives["rank"] == rank]
        in_steps = colls[colls["step"] >= 0]
        ops = set(in_steps["op"].astype(str))
        assert {"all_gather", "reduce_scatter"} <= ops
        per_step = in_steps.groupby(["step", "op"], observed=True)["bytes"].sum().unstack()
        # each rank all-gathers its shard (half of the parameters) at least once per step and
        # reduce-scatters the full gradients once per step
        param_bytes = truths[rank]["param_bytes"]
        assert (per_step["reduce_scatter"] >= param_bytes).all()
        assert (per_step["all_gather"] >= param_bytes // WORLD).all()
        ours = sorted(zip(colls["pg"].astype(str), colls["seq"]))
        assert ours == [(pg, seq) for pg, seq, _, _ in fr_collectives_after_init(truths[rank])]


def test_manifest_describes_rank_and_process_groups(ddp_run):
    trace, _ = ddp_run
    for rank in range(WORLD):
        manifest = trace.manifest(rank)
        assert manifest.rank == rank and manifest.world_size == WORLD
        assert manifest.backend == "gloo" and manifest.launcher == "torchrun"
        assert manifest.flops_per_step == 1e9 and manifest.flops_source == "user"
        assert manifest.finished
        # one host, one system clock: the store round trips are skipped and the offset is exactly 0
        assert manifest.clock_offset_us == 0.0 and manifest.clock_sync_error_us == 0.0
        assert manifest.process_groups["0"].ranks == (0, 1)
    assert len({m.run_id for m in trace.manifests.values()}) == 1


def test_single_process_job_without_process_group(tmp_path):
    results = run_ranks([str(JOBS / "capture_job.py"), str(tmp_path), "plain", "3"], 1, timeout_s=120)
    assert results[0].returncode == 0, results[0].stderr
    trace = diag.load(tmp_path)
    assert trace.ranks_found == [0] and trace.steps["step"].tolist() == [0, 1, 2]
    assert trace.collectives.empty
    assert trace.manifest(0).clock_offset_us == 0.0


def test_collective_that_fails_is_recorded_without_duration(tmp_path):
    results = run_ranks([str(JOBS / "capture_job.py"), str(tmp_path), "failing", "1"], WORLD, timeout_s=120)
    assert all(r.returncode == 0 for r in results), [r.stderr[-2000:] for r in results]
    assert "all_reduce failed" in results[0].stdout
    colls = diag.load(tmp_path).collectives
    rank0 = colls[colls["rank"] == 0].sort_values("seq")
    assert rank0["bytes"].tolist() == [16, 32]
    assert rank0["duration_us"].notna().tolist() == [True, False]
    assert rank0["seq"].diff().dropna().tolist() == [1]  # numbered like the one before it


@pytest.fixture(scope="module")
def accum_run(tmp_path_factory):
    return run_job(tmp_path_factory, "accum")


def test_gradient_accumulation_is_one_step_per_optimizer_update(accum_run):
    """DDP with ``no_sync`` micro-batches inside one ``diag.step()`` (docs/api.md, "step"): one step per update,
    every micro-batch's forward and backward in it, and the gradients all-reduced once."""
    trace, truths = accum_run
    for rank in range(WORLD):
        steps = trace.steps[trace.steps["rank"] == rank].sort_values("step")
        assert steps["step"].tolist() == list(range(STEPS))
        assert (steps["samples"] == 16 * 4).all()
        forwards_s = steps["forward_us"].to_numpy() / 1e6
        timed_s = truths[rank]["forward_s"]
        # the hooks sit inside the job's own timing of the four forwards: all four counted, not the last only
        assert all(0.5 * truth <= ours <= truth for ours, truth in zip(forwards_s, timed_s)), (forwards_s, timed_s)
        inner = steps["forward_us"] + steps["backward_us"] + steps["optimizer_us"]
        assert (inner <= steps["duration_us"] + 12).all()
        ddp = trace.collectives[(trace.collectives["rank"] == rank) & (trace.collectives["source"] == "ddp")]
        assert (ddp.groupby("step")["bytes"].sum() == truths[rank]["param_bytes"]).all()
        assert len(trace.steps[trace.steps["rank"] == rank]) == STEPS  # no micro-batch read as a step of its own


def test_gradient_accumulation_collectives_match_flight_recorder(accum_run):
    trace, truths = accum_run
    for rank in range(WORLD):
        colls = trace.collectives[trace.collectives["rank"] == rank]
        ours = sorted(zip(colls["pg"].astype(str), colls["seq"], colls["op"].astype(str), colls["bytes"]))
        assert ours == fr_collectives_after_init(truths[rank])
