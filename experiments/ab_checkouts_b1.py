"""Batch-1 speed of two checkouts of specedge on one bundle: each measurement a fresh process with PYTHONPATH at
one checkout, checkouts alternating per round (drift hits both alike); the process is runtime_v2_b1.py's (three
code prompts, `target` and `adaptive`, tokens over generate time).

    git worktree add /tmp/old COMMIT
    python experiments/ab_checkouts_b1.py BUNDLE --old /tmp/old --new . [--rounds 3] [--tokens 64]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from runtime_v2_b1 import RUN  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", default=".")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    runs = {"old": [], "new": []}
    for r in range(args.rounds):
        for name in ("old", "new"):
            env = {**os.environ, "PYTHONPATH": str(Path(getattr(args, name)).resolve())}
            out = subprocess.run([sys.executable, "-c", RUN, str(Path(args.bundle).resolve()), str(args.tokens), "1",
                                  "default"], env=env, capture_output=True, text=True, cwd="/tmp", check=True)
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {name}: {runs[name][-1]}", flush=True)
    for policy in ("target", "adaptive"):
        old, new = [x[policy] for x in runs["old"]], [x[policy] for x in runs["new"]]
        print(f"{policy:9s} old {statistics.median(old):6.2f}  new {statistics.median(new):6.2f} tok/s  "
              f"ratio {statistics.median(new) / statistics.median(old):.3f}  per round "
              f"{', '.join(f'{b / a:.2f}' for a, b in zip(old, new))}")


if __name__ == "__main__":
    main()
