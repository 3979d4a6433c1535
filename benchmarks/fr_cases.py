"""Score diag triage and torch's own analyser (torchfrtrace) on the Flight Recorder cases of
tests/triage/fr_cases.py: NCCL-format dumps rebuilt from PyTorch's test_fr_analysis.py and of the hard cases
(send/recv, coalesced groups, states, all_to_all split sizes, a rank without a dump), and real torch 2.13 gloo
dumps (tests/fixtures/flight_recorder).

    PYTHONPATH=$PWD python3 benchmarks/fr_cases.py            # this tree's diag
    cd /tmp && PYTHONPATH=/work/main python3 /path/to/benchmarks/fr_cases.py   # another tree's diag

(run from outside a checkout, or ``python -m`` puts the current directory first on the path). diag is right
when its verdict is one of the case's right verdicts and, where the case names culprits, its culprits are those.
torchfrtrace names no culprit set: it is scored on whether it reports a problem where there is one (a
collective failing its checks, ``pass_check`` as its own tests read it, or a logged report of ranks not joining
a collective or of its errors) and none where there is none; a crash is wrong. ``--json PATH`` writes every row.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import logging
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES_FILE = ROOT / "tests" / "triage" / "fr_cases.py"


def load_cases():
    spec = importlib.util.spec_from_file_location("fr_cases", CASES_FILE)
    module = importlib.util.module_from_spec(spec)
    sys.modules["fr_cases"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module.all_cases()


def diag_answer(directory: Path) -> tuple[str, list[int], str]:
    from diag.triage.analysis import triage
    from diag.triage.sources import read_fr_dir

    try:
        verdict = triage(read_fr_dir(directory))
    except Exception as exc:  # a crash is an answer, and a wrong one
        return "crash", [], f"{type(exc).__name__}: {exc}"
    return verdict.verdict, sorted(verdict.culprit_ranks), ""


def torchfrtrace_answer(directory: Path) -> str:
    """'problem', 'no_problem' or 'crash: ...' from torch's analyser, run as its CLI runs it."""
    try:
        from torch.distributed.flight_recorder.components.builder import build_db
        from torch.distributed.flight_recorder.components.config_manager import JobConfig
        from torch.distributed.flight_recorder.components.loader import read_dir
    except ImportError:
        return "absent"
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger = logging.getLogger("Flight Recorder")
    handler = Collect(level=logging.INFO)
    own_handlers = logger.handlers[:]  # its own handler writes to the stderr of when it was made: silenced
    logger.handlers = [handler]
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            args = JobConfig().parse_args([str(directory)])
            details, version = read_dir(args)
            db = build_db(details, args, version)
    except BaseException as exc:  # it exits on some inputs (SystemExit) and asserts on others
        return f"crash: {type(exc).__name__} {str(exc)[:60]}"
    finally:
        logger.handlers = own_handlers
    # what a user of it reads: a collective failing its checks (pass_check, as its own tests read it) or a
    # report of ranks not joining a collective or of errors in one
    failed = any(not c.pass_check for c in db.collectives)
    reported = any("Not all ranks joining" in m or "has errors" in m or "mismatch" in m.lower() for m in records)
    return "problem" if failed or reported else "no_problem"


def score(case, verdict: str, culprits: list[int]) -> bool:
    return verdict in case.verdicts and (case.culprits is None or culprits == sorted(case.culprits))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write every row to this file")
    parser.add_argument("--no-torch", action="store_true", help="do not run torchfrtrace")
    args = parser.parse_args()
    rows = []
    for case in load_cases():
        with tempfile.TemporaryDirectory() as tmp:
            directory = Path(tmp)
            case.write(directory)
            verdict, culprits, error = diag_answer(directory)
            torch_says = "not run" if args.no_torch else torchfrtrace_answer(directory)
        diag_right = score(case, verdict, culprits)
        torch_right = torch_says == ("no_problem" if case.verdicts[0] == "no_problem" else "problem")
        rows.append(
            {
                "case": case.name,
                "source": case.source,
                "expected": case.expected,
                "diag": f"{verdict} [{','.join(map(str, culprits)) or '-'}]" + (f" {error}" if error else ""),
                "diag_right": diag_right,
                "torchfrtrace": torch_says,
                "torchfrtrace_right": torch_right,
            }
        )
    width = max(len(r["case"]) for r in rows)
    print(f"{'case':<{width}}  {'expected':<22} {'diag':<24} ok  {'torchfrtrace':<28} ok")
    for r in rows:
        print(
            f"{r['case']:<{width}}  {r['expected']:<22} {r['diag'][:24]:<24} {'Y' if r['diag_right'] else '-':<3} "
            f"{r['torchfrtrace'][:28]:<28} {'Y' if r['torchfrtrace_right'] else '-'}"
        )
    total = len(rows)
    print(f"\ndiag right on {sum(r['diag_right'] for r in rows)}/{total}")
    if not args.no_torch:
        print(f"torchfrtrace right on {sum(r['torchfrtrace_right'] for r in rows)}/{total} (problem found or not)")
    for source in sorted({r["source"] for r in rows}):
        mine = [r for r in rows if r["source"] == source]
        print(
            f"  {source}: diag {sum(r['diag_right'] for r in mine)}/{len(mine)}"
            + ("" if args.no_torch else f", torchfrtrace {sum(r['torchfrtrace_right'] for r in mine)}/{len(mine)}")
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
