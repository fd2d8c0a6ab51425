#!/usr/bin/env bash
# The GPU check in one command, for the GPU machine the device tool lends (see docs/gpu.md for the whole recipe):
# exactness first, then timing, on every GPU backend installed there; the JSON is rewritten after each stage.
#   here:   ../shared/device/stage-ort-gpu.sh 1.32.0        (onnxruntime-gpu in chunk folders .ortgpu1 .. N)
#   there:  calls 1 .. N-1 carry one chunk each (command: true); call N carries the last and runs
#           source .ortgpuN/install.sh && scripts/gpu-check.sh "$OUT"
# Budget: under 4 minutes on one GPU (each stage has its own time limit below).
set -uo pipefail
out=${1:-gpu-check-out}
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
# exactness on tiny models (~1 minute), then timing on the real pair's shapes (~2 minutes)
timeout 100 python3 scripts/gpu_check.py --out "$out" --skip timing; rc=$?
cp "$out/gpu-check.json" "$out/gpu-check-exactness.json" 2>/dev/null
timeout 130 python3 scripts/gpu_check.py --out "$out" --skip exactness; rc2=$?
cp "$out/gpu-check.json" "$out/gpu-check-timing.json" 2>/dev/null
echo "exactness rc $rc, timing rc $rc2 (124: cut off by its time limit)"
exit $(( rc || rc2 ))
