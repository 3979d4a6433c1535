"""Does ``diag compare`` read the same job run twice as "no change", and planted changes as changes, at its
default threshold? Real 2-rank gloo DDP runs of tests/compare/compare_job.py, one after the other.

Each round runs, in this order: the base job, the same job with its data loader sleeping 8 ms a batch
(``data``), with DDP buckets of 100 bytes (``tiny-buckets``), then the base job at 256 samples a step
(``large-base``) and a model 16x larger at that batch (``large``). Reported, at the default threshold:

* false changes: pairs of base runs (consecutive rounds, and all pairs) whose verdict is not "no change";
* detection: each planted variant against the base run of its own round: the verdict must be "regression";
* the same with repeats (``diag compare --interleaved``, 3 and 4 pairs): the same job as base runs of
  consecutive rounds alternately on each side, each variant against the base runs of the same rounds;
* the run-to-run noise the consecutive same-job pairs measure (a robust standard deviation: ``RUN_NOISE_PCT``
  holds one for CPU runs times ``TAILS_FACTOR``).

``--interference N`` starts N background processes that each burn a CPU for random stretches (0.3-4 s busy,
0.3-4 s idle, seeded), standing for the other jobs of a shared machine: they slow runs by different amounts
at different times, within a run and between runs. ``--keep DIR`` keeps the traces (and ``--from DIR``
re-reads them, to evaluate another rule on the same runs without running them again; ``--details`` adds each
base run's windows and drift and each consecutive pair's verdict, interval and floor: why a pair reads a change).

    python benchmarks/bench_compare_noise.py --rounds 13
    python benchmarks/bench_compare_noise.py --rounds 13 --interference 1 --keep /tmp/noise-runs
    python benchmarks/bench_compare_noise.py --from /tmp/noise-runs --details
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import multiprocessing
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import numpy as np  # noqa: E402
from record import Table, add_json_option  # noqa: E402

from diag.analysis.compare import (  # noqa: E402
    MAD_TO_SIGMA,
    RUN_NOISE_PCT,
    STEADY_QUANTILE,
    THRESHOLD_PCT,
    compare_runs,
    drift_pct,
    summarize_run,
)
from diag.analysis.report import analyze  # noqa: E402
from diag.launch import run_ranks  # noqa: E402
from diag.trace.loader import load  # noqa: E402

JOB = ROOT / "tests" / "compare" / "compare_job.py"
BASE = ("--steps", "60", "--width", "128", "--depth", "8", "--batch", "64")
LARGE = ("--steps", "40", "--depth", "8", "--batch", "256")
VARIANTS = {  # name -> arguments, in the order a round runs them
    "base": BASE,
    "data": (*BASE, "--data-sleep-ms", "8"),
    "tiny-buckets": (*BASE, "--bucket-cap-mb", "0.0001"),
    "large-base": (*LARGE, "--width", "128"),
    "large": (*LARGE, "--width", "512"),
}
PLANTED = {"data": "base", "tiny-buckets": "base", "large": "large-base"}  # variant -> its base
PLANTED_LABELS = {"data": "slow loader", "tiny-buckets": "tiny buckets", "large": "16x model"}


def burn(seed: int, stop) -> None:
    """Busy for 0.3-4 s, idle for 0.3-4 s, until ``stop`` is set: another job on a shared machine."""
    rng = random.Random(seed)
    while not stop.is_set():
        until = time.perf_counter() + rng.uniform(0.3, 4.0)
        while time.perf_counter() < until and not stop.is_set():
            pass
        stop.wait(rng.uniform(0.3, 4.0))


def run_rounds(root: Path, rounds: int) -> None:
    for i in range(rounds):
        for name, args in VARIANTS.items():
            path = root / f"{name}-{i:02d}"
            load_before = os.getloadavg()[0]
            results = run_ranks([str(JOB), str(path), *args], 2, timeout_s=300)
            for result in results:
                if result.returncode != 0:
                    sys.exit(f"{path}: rank {result.rank} failed:\n{result.stderr[-2000:]}")
            (path / "bench-load.json").write_text(json.dumps({"load_average": load_before}))
        print(f"round {i + 1}/{rounds} done (load average {os.getloadavg()[0]:.1f})", flush=True)


def summaries(root: Path) -> dict[str, list]:
    out: dict[str, list] = {name: [] for name in VARIANTS}
    for name in VARIANTS:
        for path in sorted(root.glob(f"{name}-[0-9][0-9]")):
            if not (path / "bench-load.json").exists():  # written when the run ended: one stopped midway is left out
                continue
            trace = load(path)
            out[name].append(summarize_run(trace, analyze(trace), path.name))
    return out


def loads(root: Path, runs: dict[str, list]) -> dict[str, list]:
    """The load average before each run (written by run_rounds)."""
    return {
        name: [json.loads((root / r.label / "bench-load.json").read_text())["load_average"] for r in v]
        for name, v in runs.items()
    }


def verdict(base, new, threshold_pct: float) -> dict:
    c = compare_runs([base, new], threshold_pct=threshold_pct).comparisons[0]
    return {
        "verdict": c.verdict,
        "change_pct": c.step_time.steady_change_pct,
        "within_noise": c.step_time.within_noise,
        "summary": c.summary,
    }


def level(run) -> float:
    return float(np.quantile(run.step_ms, STEADY_QUANTILE))


def measured_run_noise_pct(base: list) -> float:
    """One run's level off the job's, from the consecutive same-job pairs: robust std of their log differences
    (1.4826 x the median absolute difference; differences of two runs: / sqrt 2), in %."""
    d = np.diff(np.log([level(r) for r in base]))
    return float(100 * MAD_TO_SIGMA * np.median(np.abs(d)) / math.sqrt(2))


def interleaved(bases: list, news: list, threshold_pct: float) -> dict:
    runs = [r for pair in zip(bases, news, strict=True) for r in pair]
    c = compare_runs(runs, threshold_pct=threshold_pct, interleaved=True).comparisons[0]
    return {"verdict": c.verdict, "change_pct": c.step_time.repeats.change_pct, "summary": c.summary}


def evaluate_repeats(runs: dict[str, list], threshold_pct: float, pairs: int) -> dict:
    """--interleaved with ``pairs`` pairs: the same job as BASE NEW BASE NEW ... (base runs of consecutive
    rounds, alternately on each side: every window of 2 x pairs rounds), and each planted variant against the
    base of its own rounds (every window of ``pairs`` rounds, as each round ran them one after the other)."""
    base = runs["base"]
    same = [
        interleaved(base[s : s + 2 * pairs : 2], base[s + 1 : s + 2 * pairs : 2], threshold_pct)
        for s in range(len(base) - 2 * pairs + 1)
    ]
    out = {"pairs": pairs, "false": sum(v["verdict"] != "no change" for v in same), "same": len(same), "detected": {}}
    for variant, of in PLANTED.items():
        n = min(len(runs[of]), len(runs[variant]))
        found = [
            interleaved(runs[of][s : s + pairs], runs[variant][s : s + pairs], threshold_pct)
            for s in range(n - pairs + 1)
        ]
        out["detected"][variant] = {
            "regression": sum(v["verdict"] == "regression" for v in found),
            "windows": len(found),
        }
    return out


def details(runs: dict[str, list], loads: dict[str, list]) -> None:
    """Each base run's level, windows and drift, and each consecutive pair's verdict: why a pair reads a change."""
    base = runs["base"]
    print("| run | load avg | steps | q10 ms | median ms | drift % | windows' q10 ms |\n|---|---|---|---|---|---|---|")
    for i, r in enumerate(base):
        x = np.asarray(r.step_ms)
        windows = ", ".join(f"{np.quantile(w, STEADY_QUANTILE):.1f}" for w in np.array_split(x, 6))
        drift = drift_pct(x)
        print(f"| {i} | {loads['base'][i]:.1f} | {len(x)} | {level(r):.2f} | {np.median(x):.2f} | "
              f"{'-' if drift is None else f'{drift:.1f}'} | {windows} |")  # fmt: skip
    print("| pair | verdict | steady change % | 95% interval | drifts % | floor % |\n|---|---|---|---|---|---|")
    for i, (a, b) in enumerate(itertools.pairwise(base)):
        s = compare_runs([a, b]).comparisons[0]
        st = s.step_time
        print(f"| {i}-{i + 1} | {s.verdict}{' (within noise)' if st.within_noise else ''} | "
              f"{st.steady_change_pct:+.1f} | [{st.steady_ci_pct[0]:+.1f}, {st.steady_ci_pct[1]:+.1f}] | "
              f"{', '.join('-' if d is None else f'{d:.1f}' for d in st.drift_pct)} | {st.noise_floor_pct:.1f} |")  # fmt: skip


def evaluate(runs: dict[str, list], threshold_pct: float) -> dict:
    base = runs["base"]
    consecutive = [verdict(a, b, threshold_pct) for a, b in itertools.pairwise(base)]
    all_pairs = [verdict(a, b, threshold_pct) for a, b in itertools.combinations(base, 2)]
    out = {
        "runs": len(base),
        "false_consecutive": sum(v["verdict"] != "no change" for v in consecutive),
        "consecutive": len(consecutive),
        "false_all": sum(v["verdict"] != "no change" for v in all_pairs),
        "all": len(all_pairs),
        "false_examples": [v["summary"] for v in all_pairs if v["verdict"] != "no change"][:5],
        "detected": {},
    }
    out["within_noise"] = sum(v["within_noise"] for v in consecutive)
    out["measured_run_noise_pct"] = measured_run_noise_pct(base)
    out["repeats"] = [evaluate_repeats(runs, threshold_pct, k) for k in (3, 4)]
    for variant, of in PLANTED.items():
        pairs = [verdict(b, v, threshold_pct) for b, v in zip(runs[of], runs[variant], strict=False)]
        out["detected"][variant] = {
            "regression": sum(p["verdict"] == "regression" for p in pairs),
            "pairs": len(pairs),
            "steady_change_pct": sorted(round(p["change_pct"], 1) for p in pairs),
            "missed": [p["summary"] for p in pairs if p["verdict"] != "regression"][:3],
        }
    return out


def report(result: dict, threshold_pct: float) -> None:
    print(f"threshold {threshold_pct}% (the default: {THRESHOLD_PCT}%), {result['runs']} runs of the same job")
    print("| same job, sequential runs | read as a change |\n|---|---|")
    print(f"| consecutive pairs | {result['false_consecutive']} of {result['consecutive']} |")
    print(f"| all pairs | {result['false_all']} of {result['all']} |")
    print(
        f"| consecutive pairs read 'no change (within noise)' | {result['within_noise']} of {result['consecutive']} |"
    )
    for example in result["false_examples"]:
        print(f"  false: {example}")
    print(f"run-to-run noise measured by the consecutive pairs: {result['measured_run_noise_pct']:.1f}% "
          f"(the default for CPU runs: {RUN_NOISE_PCT['cpu']}%)")  # fmt: skip
    print("| planted change | read as a regression | steady change, % |\n|---|---|---|")
    for variant, d in result["detected"].items():
        print(f"| {variant} | {d['regression']} of {d['pairs']} | {d['steady_change_pct']} |")
        for missed in d["missed"]:
            print(f"  missed: {missed}")
    print(
        "| --interleaved | same job, read as a change | slow loader | tiny buckets | 16x model |\n|---|---|---|---|---|"
    )
    for r in result["repeats"]:
        det = r["detected"]
        print(f"| {r['pairs']} pairs | {r['false']} of {r['same']} | " + " | ".join(
            f"{det[v]['regression']} of {det[v]['windows']}" for v in PLANTED) + " |")  # fmt: skip


def judge(runs: dict[str, list], run_loads: dict[str, list], args, source: Path | None) -> None:
    """Print the verdicts' figures and save their table (``--json``); ``source``: the kept runs' directory."""
    result = evaluate(runs, args.threshold_pct)
    every_load = [x for values in run_loads.values() for x in values]
    result["load_average"] = [min(every_load), max(every_load)]
    report(result, args.threshold_pct)
    table(result, args.interference, source).save(args.json)


def table(result: dict, interference: int, source: Path | None) -> Table:
    """The verdicts as one table, a row per rule: what the docs show (``benchmarks/suite.py tables``)."""
    name = "compare_noise_burner" if interference else "compare_noise"
    out = Table(name, ["rule", "same job, consecutive pairs", "same job, all pairs", *PLANTED_LABELS.values()])
    detected = result["detected"]
    out.add(
        "default (noise floor)",
        f"{result['false_consecutive']} of {result['consecutive']}",
        f"{result['false_all']} of {result['all']}",
        *(f"{detected[v]['regression']} of {detected[v]['pairs']}" for v in PLANTED),
    )
    for r in result["repeats"]:
        out.add(
            f"`--interleaved`, {r['pairs']} pairs",
            f"{r['false']} of {r['same']}",
            "",
            *(f"{r['detected'][v]['regression']} of {r['detected'][v]['windows']}" for v in PLANTED),
        )
    out.note(
        f"{result['runs']} rounds; same job: base runs of consecutive rounds (or every pair of them) read as anything "
        "but `no change`; planted: each variant against the base run of its own round read as `regression`; "
        "`--interleaved`: windows of rounds, base runs alternately on each side."
    )
    out.note(
        f"Run-to-run noise the consecutive same-job pairs measure: {result['measured_run_noise_pct']:.1f}% a run "
        f"(the default for CPU runs: {RUN_NOISE_PCT['cpu']}%); load average before the runs "
        f"{result['load_average'][0]:.1f}-{result['load_average'][1]:.1f}"
        + (f"; {interference} CPU burner(s) beside them" if interference else "")
        + "."
    )
    if source is not None:
        out.note(f"Judged from the runs kept in {source.name} (`--from`).")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=13, help="runs of each job (13: 12 consecutive pairs)")
    parser.add_argument("--interference", type=int, default=0, help="background CPU burners")
    parser.add_argument("--threshold-pct", type=float, default=THRESHOLD_PCT)
    parser.add_argument("--keep", type=Path, help="keep the traces in this directory")
    parser.add_argument("--from", dest="source", type=Path, help="evaluate the traces kept by an earlier --keep")
    parser.add_argument("--details", action="store_true", help="each base run's windows and each pair's verdict")
    add_json_option(parser)
    args = parser.parse_args()
    if args.source is not None:
        runs = summaries(args.source)
        if args.details:
            details(runs, loads(args.source, runs))
        judge(runs, loads(args.source, runs), args, args.source)
        return
    root = args.keep or Path(tempfile.mkdtemp(prefix="diag-bench-noise-"))
    root.mkdir(parents=True, exist_ok=True)
    stop = multiprocessing.Event()
    burners = [multiprocessing.Process(target=burn, args=(seed, stop)) for seed in range(args.interference)]
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; {args.interference} burners")
    started = time.perf_counter()
    try:
        for proc in burners:
            proc.start()
        run_rounds(root, args.rounds)
    finally:
        stop.set()
        for proc in burners:
            proc.join()
    print(f"ran {args.rounds} rounds in {time.perf_counter() - started:.0f} s")
    try:
        runs = summaries(root)
        judge(runs, loads(root, runs), args, None)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
