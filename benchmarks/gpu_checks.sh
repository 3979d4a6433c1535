#!/usr/bin/env bash
# The checks a session runs when it is lent a GPU (one H100/H200): the GPU tests (pytest -m gpu: capture, CUDA
# graphs and compile's reduce-overhead under diag, the compile cases on CUDA), diag's cost on a real GPU step,
# whether a collective still overlaps compute under diag, the NVTX ranges' and the deep memory mode's cost on
# CUDA, and a real GPU sample run (3 ranks on one GPU, schema 2, deep memory mode), analysed there. Logs and the
# run go to $OUT.
#   OUT=/tmp/gpu-out bash benchmarks/gpu_checks.sh [sections...]
#   (sections: env tests capture breakdown overlap sample memdeep nvtx)
# The limits below add up to about 15 minutes: where one command may run 10, run it as two, e.g. the sections
# "env tests overlap" and then "capture sample memdeep nvtx".
set -u
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
sections=${*:-env tests capture overlap sample memdeep nvtx}
run() {  # run NAME SECONDS COMMAND...: output to $OUT/NAME.log, its status and time to $OUT/summary.txt
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    echo "$name rc=$? ${limit}s-limit took=$((SECONDS - start))s" | tee -a "$OUT/summary.txt"
}
for section in $sections; do
    case $section in
    env) run env 60 bash -c 'nvidia-smi; python3 -c "import torch, pandas, pyarrow; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0), pandas.__version__, pyarrow.__version__)"' ;;
    tests) run tests 240 python3 -m pytest -m gpu -v -rs -p no:cacheprovider --timeout 240 tests/ ;;
    capture) run capture 170 bash -c 'python3 benchmarks/bench_capture_gpu.py && python3 benchmarks/bench_capture_gpu.py --real-step --pairs 3 --steps 40' ;;
    breakdown) run breakdown 200 python3 benchmarks/bench_capture_gpu.py --real-step --breakdown --pairs 3 --steps 40 ;;
    overlap) run overlap 120 python3 benchmarks/bench_overlap_gpu.py --iterations 20 --json "$OUT/overlap.json" ;;
    nvtx) run nvtx 60 python3 benchmarks/bench_nvtx.py --iterations 50000 --range-only ;;
    memdeep) run memdeep 70 python3 benchmarks/bench_memory_deep.py --device cuda --rounds 2 --steps 15 ;;
    sample) run sample 100 bash -c 'DIAG_JOB_DEVICE=cuda DIAG_JOB_TRACE_FORMAT=2 DIAG_JOB_MEMORY_DEEP=5,2 python3 -c "
import sys; from pathlib import Path; sys.path.insert(0, \"sample_traces\"); import make_samples as m
m.STEPS = 30; m.make_sample(Path(\"/tmp/straggler-h200\"))" && python3 -m diag.cli analyze /tmp/straggler-h200 && python3 -m diag.cli analyze --format json /tmp/straggler-h200 > '"$OUT"'/straggler-h200.report.json; tar czf '"$OUT"'/straggler-h200.tgz -C /tmp straggler-h200' ;;
    esac
done
