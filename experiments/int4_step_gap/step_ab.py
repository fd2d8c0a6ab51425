"""Single-step ms: onnxruntime-genai's int4 graph (plain session) against our bundles' targets (a one-slot cursor over the cpu backend, one
row), alternating in one process.   python experiments/int4_step_gap/step_ab.py GENAI_DIR BUNDLE [BUNDLE ...]"""
import json
import sys
import time
from pathlib import Path

import numpy as np

from _genai_graph import genai_step
from specedge.runtime.backends import open_backend
from specedge.runtime.backends.base import SlotCursor

PAST, STEPS, ROUNDS = 100, 12, 14
_, genai = genai_step(sys.argv[1], past=PAST)
ids = np.random.default_rng(0).integers(100, 20000, PAST + 1).tolist()


def ours(bundle: str):
    manifest = json.loads((Path(bundle) / "manifest.json").read_text())
    entry = manifest["models"]["target"]
    step = SlotCursor(open_backend("cpu", Path(bundle) / entry["file"], entry, manifest["max_seq_len"], max_step=16))
    step.feed(ids[:PAST], last=1)

    def run():
        step.pos = PAST
        step.feed([ids[PAST]])
    return run


runs = {"onnxruntime-genai": genai, **{bundle: ours(bundle) for bundle in sys.argv[2:]}}
times = {name: [] for name in runs}
for _ in range(ROUNDS):
    for name, run in runs.items():
        run()
        start = time.perf_counter()
        for _ in range(STEPS):
            run()
        times[name].append(1e3 * (time.perf_counter() - start) / STEPS)
for name, values in times.items():
    print(f"{name}: median {np.median(values):.1f} ms per step  {[round(v, 1) for v in values]}")
