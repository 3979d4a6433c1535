"""Text of ``diag memory-plan``: the predicted bytes per GPU by category, the verdict, the layouts that fit."""

from __future__ import annotations

from diag.views.format import count, gib, pct


def render_plan_text(plan, layouts: list) -> str:
    inp = plan.input
    lines = [
        f"Model: {count(inp.params)} parameters, {inp.dtype}, {inp.optimizer}"
        + (", fp32 master weights" if plan.master_weights else "")
        + " ({:g} + {:g} + {:g} bytes/parameter)".format(*plan.state_bytes_per_param),
        f"Layout: {inp.gpus} GPUs, {inp.layout_text()}",
        "",
        "Per GPU (the first pipeline stage):",
    ]
    rows = [
        ("parameters", plan.param_bytes),
        ("gradients", plan.grad_bytes),
        ("optimizer state", plan.optimizer_state_bytes),
        ("activations", plan.activation_bytes),
        ("allocator reserve", plan.fragmentation_bytes),
        ("outside PyTorch", plan.overhead_bytes),
        ("total", plan.total_bytes),
    ]
    lines += [f"  {name:<18} {gib(value):>12}" for name, value in rows]
    if plan.cpu_bytes:
        lines.append(f"  {'on CPU (offload)':<18} {gib(plan.cpu_bytes):>12}")
    lines.append("")
    if plan.fits is None:
        lines.append("Fits: unknown (give --gpu-gib)")
    else:
        verdict = "yes" if plan.fits else "NO"
        lines.append(
            f"Fits a {gib(inp.gpu_bytes, 1)} GPU: {verdict} "
            f"({gib(abs(plan.headroom_bytes))} {'free' if plan.fits else 'short'})"
        )
    lines += ["", "Formulas:"] + [f"  {f}" for f in plan.formulas]
    lines += [f"Note: {n}" for n in plan.notes]
    if layouts:
        lines += ["", f"Cheapest layouts of these {inp.gpus} GPUs that fit (rough added step time):"]
        for other in layouts:
            lines.append(
                f"  {pct(other.slowdown, 0, signed=True):>6}  {other.input.layout_text()}: {gib(other.total_bytes)}"
            )
    elif plan.fits is False:
        lines += ["", f"No layout of {inp.gpus} GPUs fits: more GPUs, or a GPU with more memory."]
    return "\n".join(lines)
