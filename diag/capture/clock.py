"""Clock anchors: each rank's wall-clock offset from rank 0, so timelines from different hosts line up.

NTP-style round trips through the job's rendezvous store, with rank 0 as the time server: a rank writes a
ping at its time t1, rank 0 reads its clock (T) the moment the ping arrives and answers, the answer arrives
at the rank's t2. T lies between t1 and t2 in true time, so the offset (t1 + t2) / 2 - T is within
(t2 - t1) / 2 of the truth whatever the delays; of several rounds the shortest keeps the tightest bound.

Ranks on one host read one system clock, so only the lowest rank of each host measures; the others take
its result, and ranks on rank 0's host are exactly 0. The store is used rather than collectives because it
needs no extra communicator (NCCL would build one for every pair that exchanges point-to-point) and does
not touch the GPU; the barrier-and-all-gather method it replaced read 0.5-4 ms of error where the truth
was 0 (docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

PREFIX = "diag/clock"
_generation = 0  # one key space per synchronisation, should a process call diag.init twice


@dataclass(frozen=True)
class ClockSync:
    offset_us: float  # this rank's clock minus rank 0's
    error_us: float  # the true offset is within offset_us +- error_us
    run_id: str


def wall_clock_us() -> int:
    return time.time_ns() // 1000


def synchronise_clocks(
    store,
    rank: int,
    world_size: int,
    host: str,
    rounds: int = 8,
    timeout_s: float = 300.0,
    clock_us: Callable[[], int] = wall_clock_us,
) -> ClockSync:
    """Every rank of the job must call it (diag.init does); rank 0 answers the other hosts one at a time.

    ``store`` is the job's rendezvous store (set / get / wait / multi_get / multi_set / delete_key). Raises
    the store's error when a rank does not arrive within ``timeout_s``.
    """
    global _generation
    _generation += 1
    keys = _Keys(f"{PREFIX}/{_generation}")
    timeout = timedelta(seconds=timeout_s)
    store.set(keys.host(rank), host)
    if rank == 0:
        return _serve(store, keys, host, world_size, rounds, timeout, clock_us)
    return _ask(store, keys, rank, rounds, timeout, clock_us)


class _Keys:
    def __init__(self, prefix: str):
        self.prefix = prefix

    def host(self, rank: int) -> str:
        return f"{self.prefix}/host/{rank}"

    def plan(self, rank: int) -> str:
        return f"{self.prefix}/plan/{rank}"

    def ping(self, rank: int, round_: int) -> str:
        return f"{self.prefix}/ping/{rank}/{round_}"

    def pong(self, rank: int, round_: int) -> str:
        return f"{self.prefix}/pong/{rank}/{round_}"

    def result(self, rank: int) -> str:
        return f"{self.prefix}/result/{rank}"


def _serve(store, keys: _Keys, my_host: str, world_size: int, rounds: int, timeout: timedelta, clock_us) -> ClockSync:
    """Rank 0: learn every rank's host, tell each what to do, then answer each other host's pings in turn."""
    run_id = f"{random.getrandbits(62):016x}"
    peers = list(range(1, world_size))
    host_keys = [keys.host(r) for r in peers]
    store.wait(host_keys, timeout)
    hosts = [h.decode() for h in store.multi_get(host_keys)] if peers else []
    leaders: dict[str, int] = {}  # host -> the rank that measures for it
    others: dict[str, str] = {}  # plan key -> plan of a rank that does not measure
    for rank, host in zip(peers, hosts):
        if host == my_host:
            others[keys.plan(rank)] = f"{run_id} zero"
        elif host in leaders:
            others[keys.plan(rank)] = f"{run_id} follow {leaders[host]}"
        else:
            leaders[host] = rank
    # the others learn their plan at once; each leader's plan is its signal that rank 0 now listens to it
    if others:
        store.multi_set(list(others), list(others.values()))
    for rank in leaders.values():
        store.set(keys.plan(rank), f"{run_id} measure")
        for round_ in range(rounds):
            store.wait([keys.ping(rank, round_)], timeout)
            store.set(keys.pong(rank, round_), str(clock_us()))
    _delete(store, [keys.host(0)])
    return ClockSync(offset_us=0.0, error_us=0.0, run_id=run_id)


def _ask(store, keys: _Keys, rank: int, rounds: int, timeout: timedelta, clock_us) -> ClockSync:
    store.wait([keys.plan(rank)], timeout)
    run_id, action, *leader = store.get(keys.plan(rank)).decode().split()
    if action == "zero":
        offset_us, error_us = 0.0, 0.0
    elif action == "follow":
        result_key = keys.result(int(leader[0]))
        store.wait([result_key], timeout)
        offset_us, error_us = (float(v) for v in store.get(result_key).decode().split())
    else:
        offset_us, error_us = _measure(store, keys, rank, rounds, timeout, clock_us)
        store.set(keys.result(rank), f"{offset_us} {error_us}")
    _forget(store, keys, rank, rounds if action == "measure" else 0)
    return ClockSync(offset_us=offset_us, error_us=error_us, run_id=run_id)


def _measure(store, keys: _Keys, rank: int, rounds: int, timeout: timedelta, clock_us) -> tuple[float, float]:
    best = None
    for round_ in range(rounds):
        sent_us = clock_us()
        store.set(keys.ping(rank, round_), "")
        store.wait([keys.pong(rank, round_)], timeout)
        received_us = clock_us()
        server_us = int(store.get(keys.pong(rank, round_)))
        round_trip_us = received_us - sent_us
        if best is None or round_trip_us < best[0]:
            best = (round_trip_us, (sent_us + received_us) / 2 - server_us)
    round_trip_us, offset_us = best
    return float(offset_us), round_trip_us / 2


def _forget(store, keys: _Keys, rank: int, rounds: int) -> None:
    """Delete this rank's keys once rank 0 is done with them (results stay: followers may still read them)."""
    names = [keys.host(rank), keys.plan(rank)]
    names += [keys.ping(rank, r) for r in range(rounds)] + [keys.pong(rank, r) for r in range(rounds)]
    _delete(store, names)


def _delete(store, names: list[str]) -> None:
    for name in names:
        # a store without deletion leaves a few bytes behind
        with contextlib.suppress(Exception):
            store.delete_key(name)
