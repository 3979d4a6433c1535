"""Clock offsets measured through a real TCPStore by real processes, with hosts whose clocks are set apart."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch.multiprocessing as mp

from diag.launch import free_port

# rank -> (host, its clock minus the true time in us): two ranks share rank 0's host, two share host b
HOSTS = ["a", "a", "b", "b", "c"]
SKEW_US = {"a": 0, "b": 5_000_000, "c": -2_500_000}


def _sync_rank(rank: int, port: int, results, absent_rank: int | None, timeout_s: float) -> None:
    import torch.distributed as dist

    from diag.capture.clock import synchronise_clocks

    store = dist.TCPStore("127.0.0.1", port, len(HOSTS), rank == 0, timeout=timedelta(seconds=60))
    if rank == absent_rank:
        results.put((rank, "absent"))
        time.sleep(timeout_s + 5)
        return
    host = HOSTS[rank]
    skewed_clock = lambda: time.time_ns() // 1000 + SKEW_US[host]  # noqa: E731
    try:
        sync = synchronise_clocks(store, rank, len(HOSTS), host, timeout_s=timeout_s, clock_us=skewed_clock)
    except Exception as exc:
        results.put((rank, f"raised {type(exc).__name__}"))
        if rank == 0:  # rank 0 hosts the store: keep it up while the others time out on their own
            time.sleep(3)
        return
    store.add("done", 1)
    if rank == 0:  # once everyone is done, see what was left in the store
        store.wait(["done"])
        while int(store.add("done", 0)) < len(HOSTS):
            time.sleep(0.01)
        left = [
            key
            for key in ("host/2", "plan/2", "ping/2/0", "pong/2/0", "result/2")
            if store.check([f"diag/clock/1/{key}"])
        ]
        results.put(("left", left))
    results.put((rank, sync))


def _run(absent_rank: int | None = None, timeout_s: float = 60.0) -> dict:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_sync_rank, args=(r, port, results, absent_rank, timeout_s)) for r in range(len(HOSTS))]
    for p in procs:
        p.start()
    out = dict(results.get(timeout=120) for _ in range(len(HOSTS) + (absent_rank is None)))
    for p in procs:
        p.join(timeout=60)
    return out


@pytest.fixture(scope="module")
def synced():
    return _run()


def test_ranks_on_rank_0s_host_are_exactly_zero(synced):
    assert synced[0].offset_us == 0.0 and synced[1].offset_us == 0.0
    assert synced[1].error_us == 0.0


def test_offset_of_another_host_is_within_its_stated_error(synced):
    for rank in (2, 4):
        sync, truth_us = synced[rank], SKEW_US[HOSTS[rank]]
        # NTP bound: rank 0 read its clock between the ping and the answer, so the truth is within +-error
        assert abs(sync.offset_us - truth_us) <= sync.error_us + 1, (rank, sync)
        # half a store round trip on one machine: microseconds when idle, a few ms on a loaded CI box
        assert 0 < sync.error_us < 20_000, sync


def test_second_rank_of_a_host_takes_its_leaders_measurement(synced):
    assert synced[3].offset_us == synced[2].offset_us and synced[3].error_us == synced[2].error_us


def test_every_rank_agrees_on_rank_0s_run_id(synced):
    assert len({synced[r].run_id for r in range(len(HOSTS))}) == 1


def test_round_trip_keys_are_deleted_and_results_kept(synced):
    assert synced["left"] == ["result/2"]


def test_a_rank_that_never_arrives_makes_every_other_rank_give_up_after_the_timeout():
    started = time.monotonic()
    out = _run(absent_rank=3, timeout_s=3)
    assert out[3] == "absent"
    assert all(out[r] == "raised DistStoreError" for r in (0, 1, 2, 4)), out
    assert time.monotonic() - started < 60
