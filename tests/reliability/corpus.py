"""The corruption corpus: cases built programmatically from the real sample run (sample_traces/straggler) by
applying each class of damage, and a runner that puts one case through every command.

``build_cases()`` names every case; ``make_case(name, dest)`` builds one. Classes: every table x column kind
x mutation (a value that does not fit its column), file-level damage (truncation, binary junk, empty, wrong
header, a FIFO or /dev/zero under a file's name), manifests with odd types and insane values, deep and huge
JSON, rank directories with absurd numbers or two spellings, a second run appended, swapped start/duration,
hostile Flight Recorder pickles (cycles, deep nesting, code that would touch a sentinel file) and damaged
Kineto traces. ``python -m tests.reliability.corpus CASE_DIR`` runs every command on a case and prints a
JSON summary (used by test_corpus.py in a subprocess under a memory limit and a timeout).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "straggler"
SENTINEL_NAME = "PICKLE_RAN_CODE"
TABLE_COLUMNS = {  # (table file, column index) of each kind, in the sample's three tables
    "steps.csv": {"int": 0, "int_time": 1, "int_nullable": 9},
    "collectives.csv": {"int": 0, "category": 3, "float": 8},
    "memory.csv": {"int": 0},
}
MUTATIONS = {
    "float": b"1.5",
    "inf": b"inf",
    "nan": b"nan",
    "digits20": b"123456789012345678901",
    "text": b"abc",
    "nonutf8": b"\xff\xfe\x00",
    "empty": b"",
    "negative": b"-5",
    "quote": b'"x',
}


def _mutate_cell(rank_dir: Path, file_name: str, column: int, value: bytes) -> None:
    path = rank_dir / file_name
    lines = path.read_bytes().split(b"\n")
    row = min(len(lines) - 2, 6)
    fields = lines[row].split(b",")
    if column < len(fields):
        fields[column] = value
    lines[row] = b",".join(fields)
    path.write_bytes(b"\n".join(lines))


def _replace_with_fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def _replace_with_link(path: Path, target: str) -> None:
    path.unlink(missing_ok=True)
    os.symlink(target, path)


def _edit_manifest(run: Path, **changes) -> None:
    path = run / "rank00000" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest.update(changes)
    path.write_text(json.dumps(manifest))


class _Exploit:
    def __init__(self, sentinel: Path):
        self.sentinel = sentinel

    def __reduce__(self):
        return (os.system, (f"touch {self.sentinel}",))


def _second_run(run: Path) -> None:
    for rank_dir in sorted(run.glob("rank*")):
        lines = (rank_dir / "steps.csv").read_text().splitlines()[2:]
        with open(rank_dir / "steps.csv", "a") as f:
            for line in lines:
                fields = line.split(",")
                fields[1] = str(int(fields[1]) + 10**9)
                f.write(",".join(fields) + "\n")


def _swap_start_duration(run: Path) -> None:
    path = run / "rank00001" / "steps.csv"
    lines = path.read_text().splitlines()
    for i in range(4, 8):
        fields = lines[i].split(",")
        fields[1], fields[2] = fields[2], fields[1]
        lines[i] = ",".join(fields)
    path.write_text("\n".join(lines) + "\n")


def _to_columnar(run: Path) -> None:
    """The sample run rewritten in schema version 2, as capture leaves a run still being written: each table's
    first half in a compacted Parquet segment (000001), the rest in the live Arrow stream (000002)."""
    from diag.trace.columnar import PARQUET_SUFFIX, StreamSegmentWriter, write_parquet
    from diag.trace.loader import read_table_arrow
    from diag.trace.schema import TABLES, segment_name

    for rank_dir in sorted(run.glob("rank*")):
        for table in TABLES.values():
            csv_path = rank_dir / table.file_name
            if not csv_path.exists():
                continue
            arrow = read_table_arrow(csv_path, table).table
            csv_path.unlink()
            half = arrow.num_rows // 2
            write_parquet(table, arrow.slice(0, half), rank_dir / segment_name(table.name, 1, PARQUET_SUFFIX))
            stream = StreamSegmentWriter(rank_dir, table)
            stream.append([tuple(row.values()) for row in arrow.slice(half).to_pylist()])
            stream.abandon()  # left live: not compacted


def _columnar_case(damage: Callable[[Path], None]) -> Callable[[Path], None]:
    def build(run: Path) -> None:
        _to_columnar(run)
        damage(run)

    return build


def _junk_in_middle(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] + os.urandom(4096) + data[len(data) // 2 :])


def _kineto(run: Path, body: bytes) -> None:
    """Replace the case by a Kineto directory (no rank directories) holding one damaged trace."""
    for child in run.iterdir():
        shutil.rmtree(child)
    (run / "rank0.pt.trace.json").write_bytes(body)


_FILE_CASES: dict[str, Callable[[Path], None]] = {
    "truncated_mid_line": lambda r: (r / "rank00000/steps.csv").write_bytes(
        (r / "rank00000/steps.csv").read_bytes()[:-37]
    ),
    "binary_junk_mid_file": lambda r: (r / "rank00000/collectives.csv").write_bytes(
        (lambda d: d[: len(d) // 2] + os.urandom(4096) + d[len(d) // 2 :])(
            (r / "rank00000/collectives.csv").read_bytes()
        )
    ),
    "random_bytes_file": lambda r: (r / "rank00001/steps.csv").write_bytes(os.urandom(65536)),
    "empty_file": lambda r: (r / "rank00001/steps.csv").write_bytes(b""),
    "wrong_header": lambda r: (r / "rank00002/steps.csv").write_text(
        "#diag-trace schema=1 table=steps\na,b,c\n1,2,3\n"
    ),
    "newer_table_schema": lambda r: (r / "rank00002/steps.csv").write_text("#diag-trace schema=9 table=steps\n"),
    "fifo_steps": lambda r: _replace_with_fifo(r / "rank00000/steps.csv"),
    "fifo_manifest": lambda r: _replace_with_fifo(r / "rank00000/manifest.json"),
    "fifo_heartbeat": lambda r: _replace_with_fifo(r / "rank00000/heartbeat.json"),
    "fifo_events": lambda r: _replace_with_fifo(r / "rank00000/events.jsonl"),
    "fifo_fr_dump": lambda r: _replace_with_fifo(r / "rank00000/fr_dump.pkl"),
    "dev_zero_steps": lambda r: _replace_with_link(r / "rank00000/steps.csv", "/dev/zero"),
    "dev_zero_manifest": lambda r: _replace_with_link(r / "rank00000/manifest.json", "/dev/zero"),
    "manifest_deep": lambda r: (r / "rank00000/manifest.json").write_text("[" * 200_000 + "]" * 200_000),
    "manifest_huge": lambda r: (r / "rank00000/manifest.json").write_text('{"x": "' + "a" * (20 << 20) + '"}'),
    "manifest_not_object": lambda r: (r / "rank00000/manifest.json").write_text("[1, 2]"),
    "manifest_binary": lambda r: (r / "rank00000/manifest.json").write_bytes(os.urandom(512)),
    "manifest_world_size_text": lambda r: _edit_manifest(r, world_size="x"),
    "manifest_world_size_huge": lambda r: _edit_manifest(r, world_size=1e10),
    "manifest_world_size_negative": lambda r: _edit_manifest(r, world_size=-5),
    "manifest_peak_zero": lambda r: _edit_manifest(r, peak_tflops=0),
    "manifest_odd_types": lambda r: _edit_manifest(
        r, host=["a"], run_id={"x": 1}, device_name=5, dtype=None, clock_offset_us="x", process_groups=[1]
    ),
    "manifest_pg_huge_rank": lambda r: _edit_manifest(r, process_groups={"0": {"ranks": [0, 99999999999]}}),
    "manifest_newer_schema": lambda r: _edit_manifest(r, schema_version=99),
    "heartbeat_odd": lambda r: (r / "rank00000/heartbeat.json").write_text(
        '{"step": "x", "time_us": [1], "pid": 1e400}'
    ),
    "events_junk": lambda r: (r / "rank00000/events.jsonl").write_bytes(
        b'{"kind": "x"}\n' + os.urandom(300) + b"\n" + b"[" * 100000 + b"\n"
    ),
    "hang_dump_deep": lambda r: (r / "rank00000/hang_dump_1.json").write_text("{" + '"a":{' * 50000 + "}" * 50001),
    "rank_dir_huge_number": lambda r: shutil.copytree(r / "rank00002", r / "rank99999999999"),
    "rank_dir_two_spellings": lambda r: shutil.copytree(r / "rank00001", r / "rank1"),
    "rank_dir_is_file": lambda r: (r / "rank00005").write_text("x"),
    "second_run_appended": _second_run,
    "swapped_start_duration": _swap_start_duration,
    "pickle_self_list": lambda r: (r / "rank00000/fr_dump.pkl").write_bytes(b"\x80\x02]q\x00h\x00a."),
    "pickle_self_dict": lambda r: (r / "rank00000/fr_dump.pkl").write_bytes(
        b"\x80\x02}q\x00X\x01\x00\x00\x00kq\x01h\x00s."
    ),
    "pickle_deep": lambda r: (r / "rank00000/fr_dump.pkl").write_bytes(
        b"\x80\x02" + b"]" * 100000 + b"a" * 99999 + b"."
    ),
    "pickle_tiny": lambda r: (r / "rank00000/fr_dump.pkl").write_bytes(b"\x80"),
    "pickle_code": lambda r: (r / "rank00000/fr_dump.pkl").write_bytes(
        pickle.dumps({"entries": [_Exploit(r / SENTINEL_NAME)]}, protocol=2)
    ),
    "v2_intact": _columnar_case(lambda r: None),
    "v2_truncated_parquet": _columnar_case(
        lambda r: (r / "rank00000/collectives.000001.parquet").write_bytes(
            (r / "rank00000/collectives.000001.parquet").read_bytes()[:-100]
        )
    ),
    "v2_junk_in_stream": _columnar_case(lambda r: _junk_in_middle(r / "rank00000/steps.000002.arrows")),
    "v2_stream_cut_mid_batch": _columnar_case(
        lambda r: (r / "rank00001/steps.000002.arrows").write_bytes(
            (r / "rank00001/steps.000002.arrows").read_bytes()[:-50]
        )
    ),
    "v2_random_bytes_segment": _columnar_case(
        lambda r: (r / "rank00001/steps.000001.parquet").write_bytes(os.urandom(65536))
    ),
    "v2_wrong_table_segment": _columnar_case(
        lambda r: shutil.copy(r / "rank00002/memory.000001.parquet", r / "rank00002/steps.000001.parquet")
    ),
    "v2_fifo_segment": _columnar_case(lambda r: _replace_with_fifo(r / "rank00000/steps.000002.arrows")),
    "v2_dev_zero_segment": _columnar_case(
        lambda r: _replace_with_link(r / "rank00000/collectives.000002.arrows", "/dev/zero")
    ),
    "kineto_deep_metadata": lambda r: _kineto(
        r, b'{"deviceProperties": ' + b"[" * 100000 + b"]" * 100000 + b', "traceEvents": []}'
    ),
    "kineto_truncated": lambda r: _kineto(r, b'{"traceEvents": [{"ph": "X", "cat": "kernel", "na'),
    "kineto_odd_types": lambda r: _kineto(
        r,
        b'{"distributedInfo": {"rank": "x"}, "traceEvents": [{"ph": "X", "cat": "kernel", "ts": "a", "dur": [1],'
        b' "args": {"stream": "s"}}, 5, null, {"cat": "user_annotation", "ph": "X", "name": "ProfilerStep#x"}]}',
    ),
}


def _fr_dump(run: Path, entry: dict, as_json: bool = False) -> None:
    """A Flight Recorder dump of rank 0 with one entry of the given fields (pickle, or JSON as some versions
    write it)."""
    base = {"process_group": ["0", "default_pg"], "profiling_name": "nccl:all_reduce", "collective_seq_id": 3,
            "state": "completed", "time_created_ns": 1_795_385_910_061_116_000, "frames": []}  # fmt: skip
    dump = {"version": "2.4", "pg_config": {"0": {"name": "0", "ranks": "[0, 1, 2]"}}, "entries": [{**base, **entry}]}
    path = run / "rank00000" / "fr_dump.pkl"
    path.write_bytes(json.dumps(dump).encode() if as_json else pickle.dumps(dump, protocol=2))


def _kineto_doc(**changes) -> dict:
    """A small torch.profiler trace of rank 0 (two steps, a compute and an NCCL kernel each, their launches),
    with top-level keys replaced by ``changes``; ``event_args`` / ``event_fields`` change the first kernel."""
    event_args, event_fields = changes.pop("event_args", {}), changes.pop("event_fields", {})
    events = []
    for step in range(2):
        t0 = 1000.0 + step * 1000
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "ts": t0, "dur": 900.0})
        for i, name in enumerate(("sgemm_kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgs)")):
            corr = step * 10 + i + 1
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t0 + 10 + i * 100,
                           "dur": 5.0, "args": {"correlation": corr}})  # fmt: skip
            args = {"stream": 7 + i, "correlation": corr}
            if name.startswith("nccl"):
                args.update({"Collective name": "allreduce", "In msg nelems": 1024, "dtype": "Float",
                             "Process Group Name": "0"})  # fmt: skip
            events.append(
                {"ph": "X", "cat": "kernel", "name": name, "ts": t0 + 20 + i * 100, "dur": 50.0, "args": args}
            )
    kernel = events[2]  # the first compute kernel
    kernel["args"].update(event_args)
    kernel.update(event_fields)
    doc = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85_000_000_000}],
        "distributedInfo": {
            "backend": "nccl",
            "rank": 0,
            "world_size": 1,
            "pg_config": [
                {"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": 1, "ranks": [0]}
            ],
        },  # fmt: skip
        "baseTimeNanoseconds": 1_795_385_900_000_000_000,
        "traceEvents": events,
    }
    doc.update(changes)
    return doc


def _kineto_json(**changes) -> Callable[[Path], None]:
    return lambda r: _kineto(r, json.dumps(_kineto_doc(**changes)).encode())


def _events(run: Path, lines: list[str]) -> None:
    with open(run / "rank00000" / "events.jsonl", "a") as f:
        f.write("".join(line + "\n" for line in lines))


def _parquet_segment(run: Path, arrow) -> None:
    """Replace rank 0's steps by one Parquet segment holding ``arrow`` (written as pyarrow writes any file)."""
    import pyarrow.parquet as pq

    (run / "rank00000" / "steps.csv").unlink()
    pq.write_table(arrow, run / "rank00000" / "steps.000001.parquet")


def _duplicated_column(run: Path) -> None:
    """Rank 0's first steps segment with its step column twice (still marked as a diag segment)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    _to_columnar(run)
    path = run / "rank00000" / "steps.000001.parquet"
    table = pq.read_table(path)
    doubled = pa.Table.from_arrays([*table.columns, table.column("step")], names=[*table.column_names, "step"])
    pq.write_table(doubled.replace_schema_metadata(table.schema.metadata), path)


def _constant_rows(run: Path) -> None:
    """42 million identical rows: a few MB of Parquet (run-length encoded), gigabytes once read."""
    import pyarrow as pa

    from diag.trace.columnar import arrow_schema
    from diag.trace.schema import TABLES

    rows = 42_000_000
    schema = arrow_schema(TABLES["steps"])
    columns = [pa.nulls(rows, field.type) if field.nullable else pa.repeat(pa.scalar(1, field.type), rows)
               if pa.types.is_integer(field.type) else pa.nulls(rows, field.type) for field in schema]  # fmt: skip
    _parquet_segment(run, pa.Table.from_arrays(columns, schema=schema))


def _arrow_stream_claiming(run: Path) -> None:
    """An Arrow stream segment whose record batches say they hold 2**40 rows: every little-endian int64 equal to
    the first batch's row count (the batch length and each field node's length) edited; the buffers stay as
    small as they were."""
    import pyarrow.ipc as ipc

    _to_columnar(run)
    path = run / "rank00000" / "steps.000002.arrows"
    data = path.read_bytes()
    count = next(iter(ipc.open_stream(data))).num_rows
    path.write_bytes(data.replace(count.to_bytes(8, "little"), (1 << 40).to_bytes(8, "little")))


def _many_event_keys(run: Path) -> None:
    """30,000 distinct keys over 1,000 rows: a column per key would ask for gigabytes."""
    lines = []
    for i in range(1000):
        fields = {f"k{i}_{j}": j for j in range(30)}
        lines.append(json.dumps({"time_us": 1795385910061116 + i, "kind": "custom", **fields}))
    _events(run, lines)


def _mode_000(path: Path) -> None:
    path.chmod(0)


_ESCAPES = "\x1b]0;pwned\x07\x1b]52;c;ZXZpbA==\x07\x1b[2J\x1b[8mhidden\x1b[0m"
_FILE_CASES.update(
    {
        "fr_pickle_time_huge": lambda r: _fr_dump(r, {"time_created_ns": 10**30, "collective_seq_id": 10**30}),
        "fr_json_time_huge": lambda r: _fr_dump(r, {"time_created_ns": 10**400, "collective_seq_id": -(10**30)}, True),
        "fr_pickle_duration_huge": lambda r: _fr_dump(r, {"duration_ms": 1e308 * 10, "time_created_ns": 1e300}),
        "kineto_intact": _kineto_json(),
        "kineto_rank_huge": _kineto_json(distributedInfo={"rank": 10**12, "world_size": 4}),
        "kineto_rank_negative": _kineto_json(distributedInfo={"rank": -3, "world_size": 4}),
        "kineto_rank_float": _kineto_json(distributedInfo={"rank": 1e300}),
        "kineto_base_time_text": _kineto_json(baseTimeNanoseconds="yesterday"),
        "kineto_base_time_huge": _kineto_json(baseTimeNanoseconds=1e300),
        "kineto_step_name_huge": lambda r: _kineto(
            r, json.dumps(_kineto_doc()).replace("ProfilerStep#1", "ProfilerStep#" + "9" * 40).encode()
        ),
        "kineto_device_props_dict": _kineto_json(deviceProperties={"name": "x"}),
        "kineto_device_props_int": _kineto_json(deviceProperties=5),
        "kineto_device_props_odd_items": _kineto_json(deviceProperties=[["x"], {"name": ["y"]}]),
        "kineto_distributed_info_list": _kineto_json(distributedInfo=[0, 1]),
        "kineto_distributed_info_text": _kineto_json(distributedInfo="rank 0"),
        "kineto_pg_config_odd": _kineto_json(
            distributedInfo={"rank": 0, "world_size": "x", "pg_config": {"pg_name": 5}, "backend": [1]}
        ),
        "kineto_pg_config_items_odd": _kineto_json(
            distributedInfo={"rank": 0, "pg_config": [{"pg_name": [1], "ranks": "x", "pg_size": 1e300}, 7]}
        ),
        "kineto_stream_huge": _kineto_json(event_args={"stream": 1 << 40, "correlation": 1 << 70}),
        "kineto_args_deep": lambda r: _kineto(
            r,
            json.dumps(_kineto_doc())
            .replace('"stream": 7', '"deep": ' + "[" * 50_000 + "]" * 50_000 + ', "stream": 7')
            .encode(),
        ),
        "kineto_event_fields_odd": _kineto_json(
            event_fields={"ts": 1e300, "dur": float("inf"), "name": {"x": 1}},
            event_args={"In msg nelems": 1e300, "Process Group Name": {"x": 1}},
        ),
        "kineto_host_escapes": _kineto_json(host_name="node" + _ESCAPES, trace_id=_ESCAPES),
        # the parser's message quotes the bytes around its error: escapes in a string it gives up in
        "kineto_parse_error_escapes": lambda r: _kineto(
            r, ('{"traceEvents": [{"ph": "X", "name": "' + _ESCAPES + '", "cat": 1}').encode()
        ),
        "events_deep_rows": lambda r: _events(
            r, ['{"time_us": 1, "kind": "oom", "x": ' + "[" * 90 + "]" * 90 + "}"] * 3
        ),
        "events_numbers_as_text": lambda r: _events(
            r,
            [
                '{"time_us": "x", "kind": "step_error", "step": "3", "error": "boom"}',
                '{"time_us": null, "kind": "collective_error", "step": null, "rank": "0"}',
                '{"time_us": 5, "kind": "oom", "step": "x", "allocated_bytes": "12", "message": 7}',
            ],
        ),
        "events_odd_values": lambda r: _events(
            r,
            [
                '{"time_us": 1e300, "kind": "nonfinite", "step": [1]}',
                '{"time_us": Infinity, "kind": "step_error", "step": {}}',
                '{"time_us": -Infinity, "kind": "oom", "step": 1e300, "allocated_bytes": NaN}',
                '{"time_us": 12, "kind": ["x"], "step": 1}',
                '{"time_us": 12, "kind": {}, "step": 2}',
                '{"time_us": 99999999999999999999999999, "kind": "heartbeat_gap", "start_us": 1e300}',
            ],
        ),
        "events_many_keys": _many_event_keys,
        "v2_duplicate_column": _duplicated_column,
        "v2_arrow_rows_claimed_huge": _arrow_stream_claiming,
        "v2_parquet_constant_rows": _constant_rows,
        "nccl_log_long_prefix": lambda r: (r / "rank00000" / "nccl.log").write_text(
            ("a" * 4000 + " NCCL INFO x\n") * 200
        ),
        "nccl_log_long_spaces": lambda r: (r / "rank00000" / "nccl.log").write_text(
            (
                "host:1:2 [0] NCCL INFO Channel 00/02 :" + " 0" + " " * 4000 + "x\n"
                "host:1:2 [0] NCCL INFO NET/IB : Using " + " " * 4000 + "x\n"
                "host:1:2 [0] NCCL INFO Using network " + " " * 4000 + "x\n"
                "host:1:2 [0] NCCL INFO NCCL_DEBUG set to " + " " * 4000 + "x\n"
                "host:1:2 [0] NCCL INFO Ring 00 : 0 -> 1 -> 2" + " " * 4000 + "x\n"
                "host:1:2 [0] NCCL INFO Loaded net plugin " + " " * 4000 + "x\n"
            )
            * 30
        ),
        "rank_dir_mode_000": lambda r: _mode_000(r / "rank00001"),
        "rank_file_mode_000": lambda r: _mode_000(r / "rank00001" / "steps.csv"),
        "manifest_terminal_escapes": lambda r: _edit_manifest(
            r, run_id="run" + _ESCAPES, host="node" + _ESCAPES, device_name="gpu" + _ESCAPES
        ),
        "manifest_pg_escapes": lambda r: _edit_manifest(
            r, process_groups={"0" + _ESCAPES: {"ranks": [0, 1, 2], "desc": _ESCAPES, "backend": _ESCAPES}}
        ),
    }
)


def build_cases() -> list[str]:
    """Every case name: the table x column kind x mutation grid, then the file-level cases."""
    grid = [
        f"cell:{file_name}:{kind}:{mutation}"
        for file_name, kinds in TABLE_COLUMNS.items()
        for kind in kinds
        for mutation in MUTATIONS
    ]
    return grid + list(_FILE_CASES)


def make_case(name: str, dest: Path) -> Path:
    """A copy of the sample run at ``dest`` with the damage ``name`` applied; returns ``dest``."""
    shutil.copytree(SAMPLE, dest)
    if name.startswith("cell:"):
        _, file_name, kind, mutation = name.split(":")
        for rank_dir in (dest / "rank00000", dest / "rank00001"):
            _mutate_cell(rank_dir, file_name, TABLE_COLUMNS[file_name][kind], MUTATIONS[mutation])
    else:
        _FILE_CASES[name](dest)
    return dest


def run_case(case_dir: Path, work: Path) -> dict:
    """Every command on ``case_dir``, in this process (the caller limits memory and time). Per command: the
    exit code, whether it ended in an exception other than a clean click error, and what it printed."""
    import traceback

    from click.testing import CliRunner

    from diag.cli import main

    results = {}
    runner = CliRunner()
    commands = {
        "analyze_text": ["analyze", str(case_dir), "--no-cache"],
        "analyze_json": ["analyze", str(case_dir), "--no-cache", "--format", "json"],
        "analyze_markdown": ["analyze", str(case_dir), "--no-cache", "--format", "markdown"],
        "analyze_html": ["analyze", str(case_dir), "--html", str(work / "report.html")],  # with the cache
        "analyze_cached": ["analyze", str(case_dir), "--format", "json"],  # served from the cache just written
        "triage": ["triage", str(case_dir)],
        "export": ["export", str(case_dir), "--perfetto", str(work / "trace.json")],
    }
    for name, args in commands.items():
        result = runner.invoke(main, args)
        crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
        results[name] = {
            "exit_code": result.exit_code,
            "crashed": crashed,
            "traceback": "".join(traceback.format_exception(result.exception))[-2000:] if crashed else "",
            "output": (result.stdout + result.stderr)[:200_000],
        }
    results["dashboard"] = _in_process("dashboard", lambda: _dashboard(case_dir))
    results["telemetry"] = _in_process("telemetry", lambda: _telemetry(case_dir))
    return results


def _in_process(name: str, action) -> dict:
    import traceback

    try:
        return {"exit_code": 0, "crashed": False, "traceback": "", "output": str(action())[-4000:]}
    except Exception as exc:  # noqa: BLE001 - the corpus reports any crash as a failure
        return {
            "exit_code": 1,
            "crashed": True,
            "traceback": "".join(traceback.format_exception(exc))[-2000:],
            "output": "",
        }


def _dashboard(case_dir: Path) -> str:
    """Start-up load, then a live poll after a corrupt row is appended to a running trace."""
    from diag.dashboard.data import LiveTrace

    live = LiveTrace(case_dir, poll_interval_s=0.1, triage=False)
    live.refresh()
    first = live.snapshot
    steps = case_dir / "rank00000" / "steps.csv"
    if steps.is_file() and not steps.is_symlink():
        with open(steps, "ab") as f:
            f.write(b"9.5,\xff,inf\n")
    live.refresh()
    return f"error={first.error} analysis_error={first.analysis_error} then={live.snapshot.error}"


def _telemetry(case_dir: Path) -> str:
    from diag.commands.telemetry import TraceFollower
    from diag.metrics.prometheus import RowMetrics

    metrics = RowMetrics()
    follower = TraceFollower(case_dir, metrics, host=None)
    follower.poll()
    follower.poll()
    return f"metrics={sum(1 for _ in metrics.collect())} problem={follower.problem}"


if __name__ == "__main__":
    case, work_dir = Path(sys.argv[1]), Path(sys.argv[2])
    print(json.dumps(run_case(case, work_dir)))


# the cases every test run checks (the rest: the exhaustive run)
SAMPLED = [
    "cell:steps.csv:int:float",
    "cell:steps.csv:int_time:digits20",
    "cell:collectives.csv:category:nonutf8",
    "cell:collectives.csv:float:inf",
    "cell:memory.csv:int:quote",
    "binary_junk_mid_file",
    "random_bytes_file",
    "fifo_manifest",
    "fifo_steps",
    "dev_zero_steps",
    "manifest_deep",
    "manifest_world_size_huge",
    "manifest_peak_zero",
    "manifest_odd_types",
    "rank_dir_huge_number",
    "second_run_appended",
    "swapped_start_duration",
    "pickle_self_list",
    "pickle_code",
    "kineto_deep_metadata",
    "v2_truncated_parquet",
    "v2_junk_in_stream",
    "v2_fifo_segment",
    "fr_pickle_time_huge",
    "kineto_rank_huge",
    "kineto_device_props_dict",
    "events_odd_values",
    "events_many_keys",
    "v2_duplicate_column",
    "v2_parquet_constant_rows",
    "nccl_log_long_prefix",
    "manifest_terminal_escapes",
]
