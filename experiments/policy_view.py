"""What the adaptive policy believed when it chose k under concurrent load: concurrent_trace.py's cells (C client
threads on one background generator, no HTTP), at each concurrency target / fixed:4 / adaptive in turn, with every
weighing of the shared adaptive policy at two rows or more logged: the load, the decoding rows, the k it chose,
its estimated step cost for each k, the verify widths it had measured at that load (and how many steps ago), the
draft costs per row count it had measured, and its acceptance estimates per position.

    python experiments/policy_view.py BUNDLE [--concurrency 2,4,8,16] [--tokens 64] [--max-batch 16]
        [--out view.json]

Prints each cell's tok/s, steps with k > 0 and catch-up tokens, what its steps with k > 0 gained against plain
steps of as many rows (specedge.bench.step_gain, priced by the three cells' plain steps), then the
weighings of adaptive's cells that chose k > 0 next to the steps that ran them; --out keeps every cell's steps,
weighings and gains.
"""

import argparse
import json
import time

from concurrent_trace import cell   # experiments/ is on sys.path when run as a script

from specedge.bench.batch import parse_batches
from specedge.bench.step_gain import plain_step_s, speculation_effect
from specedge.runtime import load, policies

WEIGHINGS: list[dict] = []
_next_k = policies.AdaptivePolicy.next_k


def _logged_next_k(self, max_k, batch=1, drafting=None, rows=None, rows_fed=False):
    k = _next_k(self, max_k, batch, drafting, rows, rows_fed)
    if batch >= 2:
        curve, clock = self.costs.by_batch.get(batch), self.costs.steps
        WEIGHINGS.append({
            "t": time.perf_counter(), "load": batch, "rows": rows, "drafting": drafting, "rows_fed": rows_fed,
            "k": k, "probing": self.probing, "off": self.off,
            "step_cost_s": [self.step_cost(j, batch) for j in range(min(max_k, self.max_draft) + 1)],
            "verify_s_by_width": dict(sorted(curve.seen.items())) if curve else {},
            "verify_age_by_width": {t: clock - w for t, w in sorted(curve.when.items())} if curve else {},
            "draft_s_by_rows": dict(sorted(self.costs.draft.seen.items())),
            "acceptance": self.acceptance()[:6]})
    return k


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle")
    parser.add_argument("--concurrency", default="2,4,8,16")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--out")
    args = parser.parse_args()
    policies.AdaptivePolicy.next_k = _logged_next_k
    gen = load(args.bundle, max_batch=args.max_batch, max_queue=256, background=True, prompt_cache=False)
    for p in ("target", "fixed:4", "adaptive"):                 # warm-up, as bench-serve's
        cell(gen, p, 1, 1, args.tokens)
    cells = []
    for c in parse_batches(args.concurrency, "--concurrency"):
        for p in ("target", "fixed:4", "adaptive"):             # as bench-serve's requests per cell
            first = len(WEIGHINGS)
            steps, res = cell(gen, p, c, max(4, 2 * c), args.tokens)
            print(f"{c} clients {p}: {res['tok_per_s']:.2f} tok/s, k > 0 in {res['k_pos_steps']} of "
                  f"{res['steps']} steps, {res['catch_up_tokens']} catch-up tokens", flush=True)
            cells.append({"concurrency": c, "policy": p, "result": res, "steps": steps,
                          "weighings": WEIGHINGS[first:]})
        mine = cells[-3:]
        pooled = plain_step_s([s for cell_ in mine for s in cell_["steps"]])
        for cell_ in mine:
            cell_["effect"] = speculation_effect(cell_["steps"], pooled)
            print(f"  {cell_['policy']}: steps with k > 0 gained {100 * cell_['effect']['gain_share']:+.1f}% of the "
                  "cell's time in decode steps, against plain steps of as many rows", flush=True)
    gen.close()
    for c in cells:
        if c["policy"] != "adaptive":
            continue
        print(f"== adaptive, {c['concurrency']} clients")
        for w in (w for w in c["weighings"] if w["k"] > 0):
            print("  weighed:", json.dumps(w, default=lambda x: round(x, 4)))
        for s in (s for s in c["steps"] if max(s["k"], default=0) > 0):
            print("  ran:", {key: s[key] for key in ("batch", "k", "accepted", "catch_up_tokens", "draft_s",
                                                     "catch_up_s", "verify_s")})
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "cells": cells}, f)


if __name__ == "__main__":
    main()
