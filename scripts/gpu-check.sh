#!/usr/bin/env bash
# The GPU check in one command, for the GPU machine the device tool lends (see docs/gpu.md for the whole recipe):
# numerics and exactness first, then timing, on every GPU backend installed there; the JSON is rewritten after each
# stage, so a run cut off still reports what it finished.
#   here:   ../shared/device/stage-ort-gpu.sh 1.31.1        (onnxruntime-gpu in chunk folders .ortgpu1 .. N)
#   there:  calls 1 .. N-1 carry one chunk each, command: bash scripts/ort-chunk.sh .ortgpuI
#           call N carries the last, command: source scripts/ort-chunk.sh .ortgpuN && bash scripts/gpu-check.sh $OUT
# Took 2.5 minutes on an H200 (each part has its own time limit below, 9 minutes in all).
set -uo pipefail
out=${1:-gpu-check-out}
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
# numerics and exactness on tiny models, then timing on the real pair's shapes, then the suite's GPU-marked tests
timeout 150 python3 scripts/gpu_check.py --out "$out" --skip timing; rc=$?
cp "$out/gpu-check.json" "$out/gpu-check-exactness.json" 2>/dev/null
timeout 300 python3 scripts/gpu_check.py --out "$out" --skip exactness,numerics; rc2=$?
cp "$out/gpu-check.json" "$out/gpu-check-timing.json" 2>/dev/null
timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu_backends.py 2>&1 | tail -5 | tee "$out/pytest-gpu.txt"
rc3=${PIPESTATUS[0]}
echo "exactness rc $rc, timing rc $rc2, GPU tests rc $rc3 (124: cut off by its time limit)"
exit $(( rc || rc2 || rc3 ))
