"""Node count and MatMulNBits ms per weight shape (K, N) in one single step of each graph, alternating, under
onnxruntime's profiler (which slows both, and small nodes most).   python experiments/int4_step_gap/profile_ab.py GENAI_DIR BUNDLE"""
import collections
import json
import os
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

from specedge.runtime.backends import open_backend
from specedge.runtime.backends.base import SlotCursor
from _genai_graph import genai_step

PAST, RUNS = 100, 10


def profiled(options: ort.SessionOptions, prefix: str) -> ort.SessionOptions:
    options.enable_profiling, options.profile_file_prefix = True, prefix
    return options


genai_session, genai = genai_step(sys.argv[1], past=PAST, options=profiled(ort.SessionOptions(), "/tmp/ab_genai"))
bundle = Path(sys.argv[2])
manifest = json.loads((bundle / "manifest.json").read_text())
entry = manifest["models"]["target"]
backend = open_backend("cpu", bundle / entry["file"], entry, manifest["max_seq_len"], max_step=16, profile="/tmp/ab_ours")
step = SlotCursor(backend)
ids = np.random.default_rng(0).integers(100, 20000, PAST + 1).tolist()
step.feed(ids[:PAST], last=1)
for _ in range(RUNS):
    genai()
    step.pos = PAST
    step.feed([ids[PAST]])


def summary(path: str) -> tuple[dict, float, int]:
    events = json.load(open(path))
    os.remove(path)
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])[-(RUNS - 2):]
    kernels = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    nodes = [e for e in kernels if e["args"].get("op_name") == "MatMulNBits"]
    last = runs[-1]
    node_count = sum(last["ts"] <= e["ts"] <= last["ts"] + last["dur"] for e in kernels)    # of the optimized graph
    per_shape = collections.defaultdict(list)
    for run in runs:
        totals = collections.Counter()
        for e in nodes:
            if run["ts"] <= e["ts"] <= run["ts"] + run["dur"]:
                k = list(e["args"]["input_type_shape"][0].values())[0][-1]
                n = list(e["args"]["output_type_shape"][0].values())[0][-1]
                totals[k, n] += e["dur"]
        for shape, us in totals.items():
            per_shape[shape].append(us)
    return ({s: float(np.median(v)) / 1e3 for s, v in per_shape.items()},
            float(np.median([r["dur"] for r in runs])) / 1e3, node_count)


for name, path in (("onnxruntime-genai", genai_session.end_profiling()), ("specedge", backend.session.end_profiling())):
    shapes, total, count = summary(path)
    print(f"{name}: {count} nodes, step {total:.1f} ms, MatMulNBits {sum(shapes.values()):.1f} ms: "
          + ", ".join(f"K,N={k},{n} {ms:.2f}" for (k, n), ms in sorted(shapes.items())))
