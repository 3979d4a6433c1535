"""Host cost of diag's step span on a GPU (CUDA events, allocator statistics), and of its parts; and with
``--real-step``, what diag adds to a real GPU training step.

The real step: a GPT-like model (``bench_memory_categories.gpt``) under one-rank NCCL DDP on the GPU, bf16
autocast, AdamW, diag with its defaults (NVML telemetry, DDP buckets timed by a comm hook, the watchdog) and the
schema asked. As in bench_capture.py's ``cost_in_a_real_step``, two fresh models step alternately in one process,
one inside ``diag.step()`` with everything instrumented, the other plain; each step ends with a device
synchronise so its wall time is the step's, for both alike. The median over pairs of the difference of median
step times, and the same with two plain models (A/A).

usage (on a machine with an NVIDIA GPU): python benchmarks/bench_capture_gpu.py [--real-step [--pairs 4] [--breakdown]]
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import diag  # noqa: E402
from diag.capture.memory import _allocator_stats  # noqa: E402


def median_us(function, iterations: int = 5000) -> float:
    samples = []
    for _ in range(iterations):
        start = time.perf_counter_ns()
        function()
        samples.append(time.perf_counter_ns() - start)
    return statistics.median(samples) / 1000


def step_once(work) -> None:
    with diag.step():
        work()


def gpt_ddp(device, seed: int, layers: int, d_model: int):
    from bench_memory_categories import gpt

    torch.manual_seed(seed)
    model = gpt(layers=layers, d_model=d_model, heads=d_model // 64, vocab=VOCAB).to(device)
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index])


VOCAB = 32768


def gpu_train_step(model, optimizer, tokens) -> None:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB).float(), tokens[:, 1:].reshape(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


# --breakdown: diag's defaults less one part at a time (and NVTX on), to see what the added time is made of
BREAKDOWN = {
    "defaults": {},
    "no DDP bucket hook": {"ddp_buckets": False},
    "no NVML telemetry": {"telemetry": False},
    "no replica fingerprints": {"fingerprint_every": 0},
    "no memory rows": {"memory": False},
    "nvtx on": {"nvtx": True},
}


def real_step_cost(
    tmp: Path,
    device,
    trace_format: int,
    pairs: int,
    steps: int,
    layers: int,
    d_model: int,
    with_a_a: bool = True,
    **init_options,
) -> dict:
    """Median step time of the plain model and diag's added ms (and %), with the A/A figure beside it."""
    tokens = torch.randint(0, VOCAB, (8, 1025), device=device)

    def pair_medians(instrument: bool, pair: int) -> tuple[float, float]:
        models = [gpt_ddp(device, 0, layers, d_model), gpt_ddp(device, 0, layers, d_model)]
        plain, other = models if pair % 2 else models[::-1]
        optimizers = {id(m): torch.optim.AdamW(m.parameters(), lr=1e-4) for m in models}
        if instrument:
            diag.init(
                tmp / f"real-{trace_format}-{pair}-{len(os.listdir(tmp))}", trace_format=trace_format, **init_options
            )
            diag.instrument(other, optimizers[id(other)])
        for _ in range(5):  # warm-up: cuBLAS handles, the allocator's pools
            for model in models:
                gpu_train_step(model, optimizers[id(model)], tokens)
        times = {id(m): [] for m in models}
        for _ in range(steps):
            for model in (plain, other):
                start = time.perf_counter_ns()
                if instrument and model is other:
                    with diag.step():
                        gpu_train_step(model, optimizers[id(model)], tokens)
                else:
                    gpu_train_step(model, optimizers[id(model)], tokens)
                times[id(model)].append(time.perf_counter_ns() - start)
        if instrument:
            diag.finish()
        del models, optimizers
        torch.cuda.empty_cache()
        return statistics.median(times[id(plain)]) / 1e6, statistics.median(times[id(other)]) / 1e6

    a_a = [pair_medians(False, pair) for pair in range(pairs)] if with_a_a else [(1.0, float("nan"))]
    with_diag = [pair_medians(True, pair) for pair in range(pairs)]
    plain_ms = statistics.median(p for p, _ in with_diag)
    added_ms = statistics.median(o - p for p, o in with_diag)
    a_a_ms = statistics.median(o - p for p, o in a_a)
    return {
        "trace_format": trace_format,
        "options": init_options,
        "plain_step_ms": round(plain_ms, 3),
        "diag_added_ms": round(added_ms, 4),
        "diag_added_pct": round(100 * added_ms / plain_ms, 2),
        "a_a_added_ms": round(a_a_ms, 4),
        "a_a_added_pct": round(100 * a_a_ms / plain_ms, 2),
        "pairs": pairs,
        "steps_per_model": steps,
    }


def print_real_step(args) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.distributed.init_process_group("nccl", rank=0, world_size=1)
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    shape = (args.pairs, args.steps, args.layers, args.d_model)
    with tempfile.TemporaryDirectory() as tmp:
        if args.breakdown:
            for number, (name, options) in enumerate(BREAKDOWN.items()):
                result = real_step_cost(Path(tmp), device, 2, *shape, with_a_a=number == 0, **options)
                print(json.dumps({"variant": name, **result}))
        else:
            for trace_format in (1, 2):
                print(json.dumps(real_step_cost(Path(tmp), device, trace_format, *shape)))
    torch.distributed.destroy_process_group()


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--real-step", action="store_true", help="what diag adds to a real GPU training step")
    parser.add_argument("--breakdown", action="store_true", help="with --real-step: diag's parts, one at a time")
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=60, help="steps of each model of a pair")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--d-model", type=int, default=1024)
    args = parser.parse_args()
    if args.real_step:
        print_real_step(args)
        return
    device = torch.device("cuda", 0)
    x = torch.randn(256, 256, device=device)
    with tempfile.TemporaryDirectory() as tmp:
        diag.init(tmp, telemetry=False, watchdog=False)
        for label, work in (("empty step", lambda: None), ("step with a 256x256 matmul", lambda: x @ x)):
            spanned, plain = median_us(lambda w=work: step_once(w)), median_us(work)
            print(f"{label}: {spanned:.1f} us with diag.step(), {plain:.1f} us plain -> {spanned - plain:.1f} us added")
        print(
            f"parts: torch.cuda.memory_stats() {median_us(lambda: torch.cuda.memory_stats(device)):.1f} us, "
            f"raw allocator stats {median_us(lambda: _allocator_stats(torch, device)):.1f} us, "
            f"reset_peak_memory_stats {median_us(lambda: torch.cuda.reset_peak_memory_stats(device)):.1f} us, "
            f"CUDA event create+record {median_us(lambda: torch.cuda.Event(enable_timing=True).record()):.1f} us"
        )
        diag.finish()


if __name__ == "__main__":
    main()
