#!/usr/bin/env bash
# onnxruntime-gpu on the lent GPU machine, one carried chunk per device call (docs/gpu.md, "The GPU check").
# A device call does not keep the folders earlier calls carried, but /tmp lasts while the machine stays warm:
# each call copies its chunk there; the call that carries the last chunk (the folder with install.sh, written by
# ../shared/device/stage-ort-gpu.sh) joins them, installs the wheel into a temporary folder and puts it on
# PYTHONPATH, so that call must *source* this script:
#   calls 1 .. N-1:  bash scripts/ort-chunk.sh .ortgpuI
#   call N:          source scripts/ort-chunk.sh .ortgpuN && scripts/gpu-check.sh $OUT
chunks=/tmp/ortgpu-chunks
mkdir -p "$chunks" && cp "$1"/chunk.* "$chunks"/ || return 1 2>/dev/null || exit 1
if [ -f "$1/install.sh" ]; then
    wheel=$(grep -o 'onnxruntime_gpu-[^ ]*\.whl' "$1/install.sh" | head -1)
    site=$(mktemp -d)
    cat $(ls "$chunks"/chunk.* | sort) > "$site/$wheel"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site/site" "$site/$wheel" \
        || return 1 2>/dev/null || exit 1
    export PYTHONPATH=$site/site${PYTHONPATH:+:$PYTHONPATH}
    python3 -c "import onnxruntime as o; o.preload_dlls(); print('onnxruntime', o.__version__, o.get_available_providers())"
fi
