"""The Manifest dataclass: every documented key is a field, odd values are dropped and named, and what the
analysis cache stores reads back the same."""

from __future__ import annotations

import dataclasses
import json

from diag.trace.manifest import Manifest, ParallelLayout, PipelineLayout, ProcessGroupInfo, parse_manifests
from diag.trace.schema import MANIFEST_KEYS, MAX_RANK
from tests.conftest import REPO


def test_every_documented_manifest_key_is_a_field():
    fields = {f.name for f in dataclasses.fields(Manifest)}
    assert set(MANIFEST_KEYS) <= fields
    # the two a torch.profiler import adds are the only undocumented ones
    assert fields - set(MANIFEST_KEYS) == {"source", "trace_id"}


def test_a_sample_run_manifest_parses_into_typed_fields():
    raw = json.loads((REPO / "sample_traces" / "pipeline" / "rank00001" / "manifest.json").read_text())
    manifest = Manifest.from_json(raw, rank=1)
    assert manifest.world_size == 4 and manifest.host == "vm" and manifest.finished is True
    assert manifest.pipeline == PipelineLayout("Schedule1F1B", 4, 1, 8, 1)
    assert manifest.process_groups == {"0": ProcessGroupInfo("0", (0, 1, 2, 3), 4, "gloo", "default_pg")}
    assert manifest.clock_offset_us == -312.0 and manifest.capture["memory"] == "on"


def test_odd_values_are_dropped_and_named_once_per_key():
    notes: list[str] = []
    records = [
        {"rank": 0, "flops_per_step": 0, "peak_tflops": "fast", "world_size": 2, "finished": "yes"},
        {"rank": 1, "flops_per_step": -5.0, "world_size": 10**12, "host": ["a"], "process_groups": [1, 2]},
        {"rank": 2, "flops_per_step": float("nan"), "parallel": {"tp": 2, "pp": "x", "cp": 0}},
        {"rank": "many", "host": "ignored: no rank"},
    ]
    manifests = parse_manifests(records, notes)
    assert sorted(manifests) == [0, 1, 2]
    assert all(m.flops_per_step is None and m.peak_tflops is None for m in manifests.values())
    assert manifests[0].finished is False  # only JSON true is true
    assert manifests[1].world_size is None and manifests[1].host is None and manifests[1].process_groups == {}
    assert manifests[2].parallel == ParallelLayout(tp=2) and manifests[2].parallel.ranks_sharing_tokens() == 2
    assert notes == [
        "manifest peak_tflops fast is not a positive number: ignored",
        "manifest flops_per_step -5, 0, nan is not a positive number: ignored",
        "implausible world_size in manifests (1000000000000): ignored",
    ]


def test_process_group_members_beyond_any_real_job_are_dropped():
    group = ProcessGroupInfo.from_json("7", {"ranks": [0, "3", MAX_RANK + 1, -1, True, 2.5], "size": 2})
    assert group.ranks == (0, 3) and group.size == 2


def test_newer_schema_version_is_named():
    notes: list[str] = []
    parse_manifests([{"rank": 0, "schema_version": 99}], notes)
    assert "schema_version 99, newer than this diag" in notes[0]


def test_to_json_reads_back_the_same_manifest():
    raw = json.loads((REPO / "sample_traces" / "pipeline" / "rank00001" / "manifest.json").read_text())
    manifest = Manifest.from_json({**raw, "parallel": {"dp": 2, "tp": 2}, "job": {"scheduler": "slurm"}}, rank=1)
    again = json.loads(json.dumps(manifest.to_json()))
    assert parse_manifests([again], []) == {1: manifest}
