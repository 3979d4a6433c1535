"""Text and markdown renderings of a Report: findings first, then one section per analysis.

Both come from the same list of blocks (heading, paragraphs, tables); only the final formatting differs.
Long per-rank lists are cut to the ranks that matter; the JSON output has them all."""

from __future__ import annotations

from dataclasses import dataclass, field

from diag.views.format import (
    gib,
    iec_bytes,
    mib,
    ms_from_s,
    ms_from_us,
    num,
    pct,
    pct_from_pct,
    printable,
    rate,
    s_from_s,
    size,
)

TOP_ROWS = 10
LOSS_FORMAT = "{:.4g}"


@dataclass
class Block:
    heading: str
    lines: list[str] = field(default_factory=list)
    table: list[list[str]] | None = None  # first row is the header


def blocks(report) -> list[Block]:
    """The run and the findings, then each section of the report in the registry's order (report.SECTIONS), as
    SECTION_BLOCKS renders it; a section rendered within another (the mesh and the slow links: in the
    communication block) or not in text (the timelines: figures) has none."""
    from diag.analysis.report import SECTIONS

    out = [_run(report), _findings(report)]
    for section in SECTIONS:
        render = SECTION_BLOCKS.get(section.name)
        if render is not None:
            out.extend(render(report))
    return out


def render_text(report) -> str:
    return blocks_to_text(blocks(report))


def render_markdown(report) -> str:
    return blocks_to_markdown(blocks(report), "diag analyze report")


def blocks_to_text(page_blocks: list[Block]) -> str:
    """Blocks as plain text: underlined headings, lines, aligned tables (diag analyze and diag compare)."""
    out = []
    for block in map(_printable_block, page_blocks):
        out.append(block.heading)
        out.append("=" * len(block.heading))
        out.extend(block.lines)
        if block.table:
            out.extend(_text_table(block.table))
        out.append("")
    return "\n".join(out)


def _printable_block(block: Block) -> Block:
    """The block with every string made printable (views.format.printable): lines and cells carry names and
    messages read from trace files, which must not reach a terminal as escape sequences."""
    table = [[printable(str(cell)) for cell in row] for row in block.table] if block.table else block.table
    return Block(printable(block.heading), [printable(line) for line in block.lines], table)


def blocks_to_markdown(page_blocks: list[Block], title: str) -> str:
    out = [f"# {printable(title)}", ""]
    for block in map(_printable_block, page_blocks):
        out.append(f"## {block.heading}")
        out.append("")
        out.extend(f"{line}  " for line in block.lines)
        if block.table:
            out.append("")
            out.append("| " + " | ".join(block.table[0]) + " |")
            out.append("|" + "---|" * len(block.table[0]))
            out.extend("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in block.table[1:])
        out.append("")
    return "\n".join(out)


def _text_table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def _ranks(ranks: list[int], limit: int = 8) -> str:
    if not ranks:
        return "all"
    text = ", ".join(map(str, ranks[:limit]))
    return text + (f" +{len(ranks) - limit} more" if len(ranks) > limit else "")


def _run(report) -> Block:
    run, w = report.run, report.run.window
    block = Block("Run")
    block.lines.append(f"trace: {run.path}  run_id: {run.run_id or '-'}  device: {run.device_name or '-'}")
    if run.launcher or run.job:
        block.lines.append(f"launcher: {run.launcher or '-'}  job: {_job(run.job)}")
    block.lines.append(
        f"ranks: {len(run.ranks_found)} found of world size {run.world_size}"
        + (f"; missing: {_ranks(run.ranks_missing)}" if run.ranks_missing else "")
        + f"; hosts: {run.hosts or '-'}"
    )
    if w.first_step is None:
        block.lines.append(f"steps: {run.steps} recorded, none analysable")
    else:
        block.lines.append(
            f"steps: {run.steps} recorded; analysed {w.steps_analysed} (steps {w.first_step}..{w.last_step})"
        )
    if run.machine is not None:
        block.lines.append(machine_line(run.machine))
    block.lines.extend(f"note: {n}" for n in run.notes)
    if run.skipped_total:
        block.lines.append(f"skipped ({run.skipped_total}):")
        block.lines.extend(
            f"  - {s['path']}: {s['reason']}" + (f" ({s['lines']} lines)" if s["lines"] else "")
            for s in run.skipped[:TOP_ROWS]
        )
        if run.skipped_total > TOP_ROWS:
            block.lines.append(f"  ... {run.skipped_total - TOP_ROWS} more (see --format json)")
    return block


def machine_line(m) -> str:
    """How fast the machine ran, from the run's calibration rows (diag/analysis/calibration.py)."""
    if m.source == "runqueue":
        head = (
            f"machine: the training thread of the rank that waited most for a core waited {m.runqueue_wait_pct:.0f}% "
            f"of its runnable time (runnable work took {m.factor:.2f}x its CPU time)"
        )
    else:
        head = f"machine: a fixed {m.device} kernel took {m.factor:.0f} us (median)"
    parts = (
        [f"kernel {m.kernel_us:.0f} us, fastest {m.kernel_min_us:.0f} us"] if m.kernel_us and m.kernel_min_us else []
    )
    if m.sm_clock_mhz is not None:
        parts.append(f"SM clock {m.sm_clock_mhz:.0f} of {m.sm_clock_max_mhz or 0:.0f} MHz, P{m.pstate}")
    if m.throttled_share:
        parts.append(f"clocks held down in {100 * m.throttled_share:.0f}% of calibrations")
    return f"{head}; {', '.join(parts + [f'{m.rounds} calibrations'])}"


def _job(job: dict | None) -> str:
    if not job:
        return "-"
    text = f"{job.get('scheduler')} {job.get('job_id')}"
    if job.get("job_name") and job.get("job_name") != job.get("job_id"):
        text += f" ({job['job_name']})"
    restarts = job.get("restarts") or {}
    if restarts:
        text += ", " + ", ".join(f"{what.replace('_', ' ')} {n}" for what, n in restarts.items())
    return text


def _findings(report) -> Block:
    block = Block("Findings (by time lost)")
    if not report.findings:
        block.lines.append("No problems found in the analysed window.")
    for i, f in enumerate(report.findings, 1):
        cost = (
            f"{ms_from_s(f.time_lost_per_step_s)}/step, {s_from_s(f.time_lost_s)} in all"
            if f.time_lost_s
            else "no time lost yet"
        )
        block.lines.append(f"{i}. [{f.severity}] {f.title}  ({cost})")
        where = [f"ranks {_ranks(f.ranks)}"] if f.ranks else []
        where += [f"hosts {', '.join(f.hosts[:4])}"] if f.hosts else []
        where += [f"GPUs {', '.join(f.gpus[:4])}"] if f.gpus else []
        if where:
            block.lines.append("   where: " + "; ".join(where))
        block.lines.extend(f"   - {e}" for e in f.evidence[:6])
        block.lines.append(f"   try: {f.advice}")
    return block


def _stragglers(report) -> Block:
    s = report.stragglers
    block = Block("Stragglers")
    busy = "data wait + compute, less the time waiting for a core" if s.less_core_wait else "data wait + compute"
    block.lines.append(f"method: busy time per rank and step ({busy}), blocked time from {s.wait_source}")
    if s.noise is not None:
        block.lines.append(
            f"noise: step to step {pct(s.noise.step_spread)} of a typical step, rank to rank {pct(s.noise.rank_spread)}; "
            f"spikes above {pct(s.noise.spike_threshold, 0)}"
        )
    if s.note:
        block.lines.append(f"note: {s.note}")
    if not s.stragglers:
        if s.compared:
            block.lines.append("No straggler: no rank's work stands out from the run's noise.")
        return block
    block.lines.append(
        "job cost: what the job loses to the rank (credited worst first, they add up); "
        "fixed alone: what fixing only it would save"
    )
    block.table = [
        [
            "rank",
            "host",
            "gpu",
            "slowdown",
            "slow steps",
            "kind",
            "cause",
            "confidence",
            "job cost/step",
            "fixed alone/step",
            "last arrival",
        ]
    ]
    for x in s.stragglers[:TOP_ROWS]:
        alone = ms_from_s(x.time_saved_per_step_s)
        block.table.append(
            [
                str(x.rank),
                x.host or "-",
                num(x.gpu, "{}"),
                pct(x.slowdown),
                pct(x.steps_slow_fraction),
                "persistent" if x.persistent else "transient",
                x.cause,
                x.confidence,
                ms_from_s(x.cost_per_step_s),
                alone if x.slower_rank is None else f"{alone} (rank {x.slower_rank} slower)",
                pct(x.last_arrival_fraction),
            ]
        )
    return block


def _mfu(report) -> Block:
    m = report.mfu
    block = Block("MFU")
    block.lines.append(f"median step time: {ms_from_s(m.step_time_median_s)}")
    if m.reason:
        block.lines.append(f"MFU unknown: {m.reason}")
    else:
        block.lines.append(
            f"MFU: median {pct(m.median)}, mean {pct(m.mean)}, overall {pct(m.overall)}; {num(m.tflops_per_gpu)} TFLOP/s per GPU"
        )
        block.lines.append(f"FLOPs from {m.flops_source}; peak from {m.peak_source}")
    if m.tokens_per_s is not None:
        block.lines.append(f"throughput: {rate(m.tokens_per_s, 'tokens')}")
    if m.samples_per_s is not None:
        block.lines.append(f"throughput: {rate(m.samples_per_s, 'samples', 1)}")
    return block


def _comms(report) -> Block:
    c = report.comms
    block = Block("Communication")
    if c.exposed_comm_per_step_s is not None:
        block.lines.append(
            f"exposed communication (the least-blocked rank, median step): {ms_from_s(c.exposed_comm_per_step_s)}"
        )
    if c.note:
        block.lines.append(c.note)
    if c.collectives:
        block.table = [
            [
                "op",
                "pg",
                "size",
                "count",
                "bytes",
                "p50",
                "p99",
                "transfer p50",
                "algbw GB/s",
                "busbw GB/s",
                "wait s",
                "total s",
            ]
        ]
        for x in c.collectives[:TOP_ROWS]:
            block.table.append(
                [
                    x.op,
                    x.pg,
                    x.size_bucket,
                    str(x.count) + ("" if x.timed_count == x.count else f" ({x.timed_count} timed)"),
                    iec_bytes(x.bytes_total),
                    ms_from_us(x.duration_p50_us),
                    ms_from_us(x.duration_p99_us),
                    ms_from_us(x.transfer_p50_us),
                    num(x.algbw_gbps, "{:.3g}"),
                    num(x.busbw_gbps, "{:.3g}"),
                    f"{x.wait_total_s:.1f}" + ("*" if x.wait_from != "durations" else ""),
                    num(x.total_time_s),
                ]
            )
        if any(x.wait_from != "durations" for x in c.collectives[:TOP_ROWS]):
            block.lines.append("* waits (partly) from issue times: no duration recorded")
        if len(c.collectives) > TOP_ROWS:
            block.lines.append(f"{len(c.collectives) - TOP_ROWS} more rows in --format json")
    if c.per_rank:
        worst = sorted(c.per_rank, key=lambda r: r.wait_share_pct, reverse=True)[:3]
        least = sorted(c.per_rank, key=lambda r: r.wait_share_pct)[:3]
        block.lines.append(
            "waiting for peers, share of step time: most "
            + ", ".join(f"rank {r.rank} {pct_from_pct(r.wait_share_pct)}" for r in worst)
            + "; least "
            + ", ".join(f"rank {r.rank} {pct_from_pct(r.wait_share_pct)}" for r in least)
        )
    block.lines.extend(_mesh_lines(getattr(report, "mesh", None)))
    block.lines.extend(_slow_link_lines(getattr(report, "links", None)))
    return block


def _mesh_lines(mesh) -> list[str]:
    """Communication per device-mesh dimension."""
    if mesh is None:
        return []
    lines = [f"per device-mesh dimension ({mesh.shape}):"]
    for dim in mesh.dims:
        lines.append(
            f"  - {dim.name}: {dim.collectives} collectives in {dim.groups} groups of {dim.size} ranks, "
            f"{iec_bytes(dim.bytes_total)}, waiting for peers {s_from_s(dim.wait_s, 2)}, "
            f"collective time {s_from_s(dim.time_s, 2) if dim.time_s is not None else 'untimed'}"
        )
    return lines


def _slow_link_lines(links) -> list[str]:
    """Process groups compared by busbw: the suspect common to the slow ones, and the slowest groups."""
    if links is None:
        return []
    slow = [g for g in links.groups if g.slow]
    lines = [
        f"Slow links: {len(slow)} of {len(links.groups)} process groups below 60% of the busbw of their peers, and slower "
        "than theirs in most collectives "
        "(same op, size, group size, hosts spanned and mesh dimension)"
    ]
    for suspect in links.suspects:
        lines.append(
            f"  - {suspect.label()}: in {len(suspect.slow_groups)} of {suspect.slow_total} slow groups "
            f"({suspect.groups_including} groups include it), busbw {num(suspect.busbw_gbps, '{:.3g}')} vs "
            f"{num(suspect.peer_busbw_gbps, '{:.3g}')} GB/s, {s_from_s(suspect.lost_s, 2)} lost"
        )
    for group in slow[:5]:
        lines.append(
            f"  - group {group.pg} ({f'{group.mesh_dim}, ' if group.mesh_dim else ''}ranks {_ranks(group.ranks)}): "
            f"{pct(group.speed_ratio, 0)} of its peers' busbw, "
            f"transfer p50 {ms_from_us(group.transfer_p50_us)}"
        )
    if links.note:
        lines.append(f"  {links.note}")
    return lines


def _nccl(report) -> Block:
    """NCCL's own view: per rank its transport, version and setup; the ranks that differ from most first."""
    n = report.nccl
    block = Block("NCCL")
    versions = ", ".join(f"{v} ({len(r)} ranks)" for v, r in n.versions.items()) or "-"
    block.lines.append(f"NCCL versions: {versions}; {len(n.ranks)} ranks with an nccl.log")
    block.lines.extend(n.notes)
    if n.lines_skipped:
        block.lines.append(f"{n.lines_skipped} log lines not understood (cut short, run together, not NCCL's)")
    for group in n.groups[:TOP_ROWS]:
        block.lines.append(
            f"group {group.pg} (ranks {_ranks(group.ranks)}): {', '.join(group.transports) or '-'}, "
            f"{num(group.channels, '{:d}')} channels"
        )
    common = _most_common_row(n.ranks)
    ordered = sorted(n.ranks, key=lambda v: (_nccl_row(v) == common, v.rank))
    block.table = [["rank", "host", "version", "net", "intra-node", "GDR", "channels", "NVLS", "warnings"]]
    for view in ordered[:TOP_ROWS]:
        block.table.append([str(view.rank), view.host or "-", *_nccl_row(view), str(len(view.warnings))])
    if len(ordered) > TOP_ROWS:
        block.lines.append(f"{len(ordered) - TOP_ROWS} more ranks in --format json (the ranks unlike most first)")
    return block


def _nccl_row(view) -> list[str]:
    gdr = {True: "on", False: "off", None: "-"}[view.gdr]
    return [
        view.version or "-",
        view.net_kind or "-",
        "/".join(view.intra_node) or "-",
        gdr,
        num(view.channels, "{:d}"),
        "yes" if view.nvls else "no",
    ]


def _most_common_row(views) -> list[str] | None:
    rows = [_nccl_row(v) for v in views]
    return max(rows, key=rows.count) if rows else None


def _memory(report) -> Block:
    m = report.memory
    block = Block("Memory")
    if m.note:
        block.lines.append(m.note)
    if not m.per_rank:
        return block
    flagged = [r for r in m.per_rank if r.leak_suspected or r.near_oom or r.alloc_retries or r.ooms]
    closest = [r for r in m.per_rank if r.rank in m.closest_to_oom]
    rows = flagged + [r for r in closest if r not in flagged]
    if not rows:
        rows = sorted(m.per_rank, key=lambda r: r.growth_bytes_per_step or 0, reverse=True)[:3]
    block.lines.append(
        f"{len(m.per_rank)} ranks; metric for growth: {m.per_rank[0].metric}; showing flagged and closest to OOM"
    )
    block.table = [
        ["rank", "peak alloc", "peak reserved", "headroom", "frag", "retries", "OOMs", "growth/step", "leak?"]
    ]
    for r in rows[:TOP_ROWS]:
        block.table.append(
            [
                str(r.rank),
                gib(r.peak_allocated_bytes),
                gib(r.peak_reserved_bytes),
                pct_from_pct(r.headroom_pct, 0),
                pct_from_pct(r.fragmentation_pct, 0),
                num(r.alloc_retries, "{}"),
                num(r.ooms, "{}"),
                mib(r.growth_bytes_per_step, signed=True),
                "yes" if r.leak_suspected else "no",
            ]
        )
    return block


def _memory_detail(report) -> list[Block]:
    """Where the memory went (by category, per rank), why a rank ran out, and the plan against the measured:
    each only when the run recorded it."""
    m = report.memory
    out = []
    with_categories = [r for r in m.per_rank if r.param_bytes is not None or r.non_pytorch_bytes is not None]
    if with_categories:
        block = Block("Memory by category")
        block.lines.append(
            "Per rank: parameters, gradients and optimizer state (local shards, latest measurement), the largest "
            "step's rest of the peak allocation (activations and temporaries), memory outside PyTorch (NVML)"
        )
        for c in m.spread[:3]:
            block.lines.append(
                f"{CATEGORY_LABELS[c.category]} differ across ranks: rank {c.max_rank} {size(c.max_bytes)}, "
                f"rank {c.min_rank} {size(c.min_bytes)}"
            )
        block.table = [["rank", "params", "grads", "optimizer", "activations", "outside PyTorch", "other procs"]]
        order = m.closest_to_oom + [r.rank for r in with_categories if r.rank not in m.closest_to_oom]
        by_rank = {r.rank: r for r in with_categories}
        for rank in [r for r in order if r in by_rank][:TOP_ROWS]:
            r = by_rank[rank]
            block.table.append(
                [
                    str(r.rank),
                    *(
                        size(v)
                        for v in (
                            r.param_bytes,
                            r.grad_bytes,
                            r.optimizer_state_bytes,
                            r.activation_peak_bytes,
                            r.non_pytorch_bytes,
                            r.other_processes_bytes,
                        )
                    ),
                ]
            )
        out.append(block)
    for oom in m.ooms[:3]:
        block = Block(f"Out of memory: rank {oom.rank}" + (f", step {oom.step}" if oom.step is not None else ""))
        block.lines.append(oom.verdict[:1].upper() + oom.verdict[1:] + ".")
        facts = [
            ("asked", oom.requested_bytes),
            ("free on the GPU", oom.device_free_bytes),
            ("of", oom.device_total_bytes),
            ("allocated by PyTorch", oom.allocated_bytes),
            ("reserved but unallocated", oom.reserved_unallocated_bytes),
            ("outside PyTorch", oom.non_pytorch_bytes),
            ("other processes", oom.other_processes_bytes),
        ]
        block.lines.append(", ".join(f"{name} {size(v)}" for name, v in facts if v is not None))
        held = [
            ("parameters", oom.param_bytes),
            ("gradients", oom.grad_bytes),
            ("optimizer state", oom.optimizer_state_bytes),
            ("activations and temporaries", oom.activation_bytes),
        ]
        if any(v is not None for _, v in held):
            block.lines.append("Held: " + ", ".join(f"{name} {size(v)}" for name, v in held if v is not None))
        if oom.closest_ranks:
            block.lines.append(f"Closest to the limit: {_ranks(oom.closest_ranks)}")
        block.lines += [f"Differs from the other ranks: {d}" for d in oom.differs_by[:3]]
        block.table = [["advice (most freed first)", "frees", "enough?"]]
        for a in oom.advice[:6]:
            enough = "-" if a.enough is None else "yes" if a.enough else "no"
            block.table.append([a.action, size(a.frees_bytes) if a.frees_bytes is not None else "?", enough])
        out.append(block)
    out += [_memory_deep(d) for d in m.deep[:3]]
    if m.plan is not None and m.plan.rows:
        block = Block("Memory plan against measured")
        block.lines.append(f"diag memory-plan for this run ({m.plan.layout}), per GPU; measured: the median rank")
        block.lines += [f"Note: {n}" for n in m.plan.notes]
        block.table = [["category", "predicted", "measured", "predicted/measured"]]
        for row in m.plan.rows:
            ratio = (
                None
                if row.predicted_bytes is None or not row.measured_bytes
                else row.predicted_bytes / row.measured_bytes
            )
            block.table.append(
                [
                    CATEGORY_LABELS[row.category],
                    size(row.predicted_bytes),
                    size(row.measured_bytes),
                    num(ratio, "{:.2f}"),
                ]
            )
        out.append(block)
    return out


def _memory_deep(deep) -> Block:
    """The deep mode's answer for one rank: what was alive at the step's peak, by module and by stack."""
    from diag.analysis.memory_deep import deep_lines

    block = Block(f"Memory at the peak (deep mode): rank {deep.rank}, steps {_ranks(deep.steps)}")
    block.lines += deep_lines(deep, size)
    if deep.top_modules:
        block.table = [["module (live activations and temporaries)", "activations", "temporaries"]]
        for m in deep.top_modules[:TOP_ROWS]:
            block.table.append([m.module, size(m.activation_bytes), size(m.temporary_bytes)])
    for a in deep.top_allocations[:5]:
        frames, hidden = a.frames_from_site()
        inside = f", below {hidden} frame(s) inside torch" if hidden else ""
        block.lines.append(f"{size(a.bytes)} in {a.count} allocation(s), stack (innermost first{inside}):")
        block.lines += [f"    {frame}" for frame in frames[:8]]
    if deep.before_recording_bytes:
        block.lines.append(
            f"Allocated before the first recorded step and alive at the peak: {size(deep.before_recording_bytes)}"
        )
    if deep.history_truncated:
        block.lines.append("The allocator history overflowed its ring buffer: the earliest entries are lost")
    if deep.skipped_entries:
        block.lines.append(f"{deep.skipped_entries} malformed entries of memory_deep.json skipped")
    return block


CATEGORY_LABELS = {
    "param_bytes": "parameters",
    "grad_bytes": "gradients",
    "optimizer_state_bytes": "optimizer state",
    "activation_bytes": "activations",
    "activation_peak_bytes": "activations",
    "non_pytorch_bytes": "memory outside PyTorch",
}


def _telemetry(report) -> Block:
    t = report.telemetry
    block = Block("GPU telemetry")
    if t.note:
        block.lines.append(t.note)
    if not t.gpus:
        return block
    flagged = [g for g in t.gpus if g.throttled or g.hot or g.idle or g.ecc_uncorrected or g.xids]
    pairs = len({(g.host, g.gpu) for g in t.gpus})
    block.lines.append(f"{pairs} GPU(s) used by {len(t.gpus)} rank(s); {len(flagged)} flagged")
    rows = flagged or t.gpus[:3]
    block.table = [
        ["rank", "host:gpu", "util", "SM clock/max", "power/limit", "temp max", "throttled", "reasons", "errors"]
    ]
    for g in rows[:TOP_ROWS]:
        errors = f"ECC {g.ecc_uncorrected} XID {g.xids}" if g.ecc_uncorrected or g.xids else "-"
        block.table.append(
            [
                str(g.rank),
                f"{g.host}:{g.gpu}",
                pct_from_pct(g.util_mean_pct, 0),
                pct_from_pct(g.sm_clock_vs_max_pct, 0),
                pct_from_pct(g.power_vs_limit_pct, 0),
                num(g.temp_max_c, "{:.0f} C"),
                pct(g.throttled_share, 0),
                ",".join(sorted(g.throttle_share)) or "-",
                errors,
            ]
        )
    return block


def _bubble(report) -> Block:
    bubble = report.bubble
    theory = "unknown" if bubble.theoretical_fraction is None else pct(bubble.theoretical_fraction)
    lines = [
        f"schedule {bubble.schedule or 'unknown'}: {bubble.stages} stages, {bubble.virtual_stages} chunk(s) per rank, "
        f"{bubble.microbatches} micro-batches; {bubble.steps_analysed} steps analysed",
        f"bubble: measured {pct(bubble.measured_fraction)} of a {ms_from_s(bubble.step_span_s)} step, theory {theory} ({bubble.theory})",
        f"slowest stage {bubble.slowest_stage}: +{pct(bubble.slowest_stage_excess_fraction)} work vs the others"
        f"{'' if bubble.imbalanced else ' (within noise)'}, costs {ms_from_s(bubble.slowest_stage_time_lost_per_step_s)}/step",
        *bubble.notes,
    ]
    table = [["stage", "ranks", "busy", "idle", "bubble", "warm-up idle", "steady idle", "cool-down idle"]]
    for stage in bubble.per_stage:
        table.append(
            [
                str(stage.stage),
                _ranks(stage.ranks),
                ms_from_s(stage.busy_s),
                ms_from_s(stage.idle_s),
                pct(stage.bubble_fraction),
                ms_from_s(stage.warmup_idle_s),
                ms_from_s(stage.steady_idle_s),
                ms_from_s(stage.cooldown_idle_s),
            ]
        )
    return Block("Pipeline bubbles", lines, table)


def _health(report) -> Block:
    h = report.health
    block = Block("Training health")
    losses = [s["loss_median"] for s in h.per_step if s["loss_median"] is not None]
    if losses:
        first, last = num(losses[0], LOSS_FORMAT), num(losses[-1], LOSS_FORMAT)
        block.lines.append(f"loss (median over ranks): first {first}, last {last}")
    for n in h.first_nonfinite[:3]:
        block.lines.append(f"{n.value_name} = {n.value} on rank {n.rank} at step {n.step}")
    if h.fingerprint_steps:
        d = h.divergence
        block.lines.append(
            f"replicas compared at {h.fingerprint_steps} steps: "
            + (f"diverged at step {d.step} ({_ranks(d.ranks)})" if d else "identical")
        )
    block.lines += [f"loss spike at step {s.step} on {_ranks(s.ranks)}" for s in h.spikes[:TOP_ROWS]]
    block.lines += [f"rank {d.rank}'s {d.value_name} departs from its peers'" for d in h.departures]
    return block


def _gpu_time(report) -> Block:
    g = report.gpu_time
    block = Block("GPU time (torch.profiler trace)")
    if g.note:
        block.lines.append(g.note)
    if not g.per_rank:
        return block
    block.lines.append(
        f"per rank, over the GPU activity launched in {len(g.steps)} step(s); {g.nccl_kernels} NCCL kernels. "
        "Shares of the GPU span (first kernel start to last kernel end); definitions as Holistic Trace Analysis'"
    )
    ranks = sorted(g.per_rank, key=lambda r: -(r.exposed_communication_us + r.idle_us))
    block.table = [["rank", "span", "compute", "exposed comm", "memory", "other", "idle", "comm overlapped"]]
    for r in ranks[:TOP_ROWS]:
        block.table.append(
            [
                str(r.rank),
                ms_from_s(r.span_us / 1e6),
                pct_from_pct(r.compute_pct),
                pct_from_pct(r.exposed_communication_pct),
                pct_from_pct(r.memory_pct),
                pct_from_pct(100 * r.other_us / r.span_us if r.span_us else 0),
                pct_from_pct(r.idle_pct),
                pct_from_pct(r.comm_comp_overlap_pct),
            ]
        )
    if len(ranks) > TOP_ROWS:
        block.lines.append(
            f"showing the {TOP_ROWS} ranks with the most exposed communication + idle time of {len(ranks)}"
        )
    return block


def _when(present, render):
    """A renderer of one block, for a section only some runs have."""
    return lambda report: [render(report)] if present(report) else []


SECTION_BLOCKS = {
    "stragglers": lambda report: [_stragglers(report)],
    "mfu": lambda report: [_mfu(report)],
    "comms": lambda report: [_comms(report)],
    "nccl": _when(lambda report: getattr(report, "nccl", None) is not None, _nccl),
    "memory": lambda report: [_memory(report), *_memory_detail(report)],
    "telemetry": lambda report: [_telemetry(report)],
    "bubble": _when(lambda report: report.bubble is not None, _bubble),
    "gpu_time": _when(lambda report: getattr(report, "gpu_time", None) is not None, _gpu_time),
    "health": _when(lambda report: report.health.recorded, _health),
}
