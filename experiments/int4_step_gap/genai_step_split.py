"""Prefill and single-step cost apart: onnxruntime-genai against specedge's target (one row and two rows),
on the same weights, in one process, alternating, so drift hits all three alike.

    python experiments/int4_step_gap/genai_step_split.py GENAI_DIR BUNDLE [--steps 48] [--rounds 4] [--threads 2]

Random prompt ids of 81 and 21 tokens; greedy steps after each prefill. Prints the median prefill ms and
ms per step of each (the first round is a warm-up and not counted). specedge's two-row figure needs a
quantized target (a lone token repeated at the next position); for fp32 targets it costs little.
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import onnxruntime_genai as og

from specedge.runtime import load
from specedge.runtime.backends.base import SlotCursor


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("genai_dir")
    parser.add_argument("bundle")
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    config = og.Config(args.genai_dir)
    config.overlay(json.dumps({"model": {"decoder": {"session_options": {
        "intra_op_num_threads": args.threads, "inter_op_num_threads": 1}}}}))
    model, target = og.Model(config), load(args.bundle, threads=args.threads).target
    n = args.steps

    def genai(prompt):
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=len(prompt) + n + 1, min_length=len(prompt) + n + 1)
        generator = og.Generator(model, params)
        t = time.perf_counter()
        generator.append_tokens(np.array([prompt], dtype=np.int32))
        prefill, t = time.perf_counter() - t, time.perf_counter()
        for _ in range(n):
            generator.generate_next_token()
        return prefill, (time.perf_counter() - t) / n

    def specedge(prompt, rows):
        target.min_rows = rows
        cursor = SlotCursor(target)
        t = time.perf_counter()
        token = int(cursor.feed(prompt, last=1)[-1].argmax())
        prefill, t = time.perf_counter() - t, time.perf_counter()
        for _ in range(n):
            token = int(cursor.feed([token])[-1].argmax())
        return prefill, (time.perf_counter() - t) / n

    runs = {"onnxruntime-genai": genai, "specedge, 1 row": lambda p: specedge(p, 1),
            "specedge, 2 rows": lambda p: specedge(p, 2)}
    ids = np.random.default_rng(0).integers(100, 20000, 81).tolist()
    times = {(name, length): [] for name in runs for length in (81, 21)}
    for round_ in range(args.rounds):
        for length in (81, 21):
            for name, run in runs.items():
                result = run(ids[:length])
                if round_:
                    times[name, length].append(result)
    for (name, length), values in times.items():
        print(f"{name:18} prompt {length:3}: prefill {1e3 * statistics.median(v[0] for v in values):7.1f} ms   "
              f"step {1e3 * statistics.median(v[1] for v in values):6.1f} ms")


if __name__ == "__main__":
    main(sys.argv[1:])
