"""A useless draft on a tiny pair: how close does `adaptive` stay to target-only when nothing is accepted?

    python experiments/tiny_useless.py [--out /tmp/tiny-useless] [--repeat 3] [--tokens 64]

Target: a random 4-layer tiny llama (byte tokenizer); draft: an independent random 2-layer llama, so
acceptance is ~0 at every position. On a tiny pair the model calls are short and the loop's own host work
and the policy's probes show. Backs the useless-draft rows of docs/runtime-v2.md. Needs the export extra.
"""

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from tiny_models import byte_tokenizer, make_model, save  # noqa: E402

from specedge.bench import run_bench  # noqa: E402
from specedge.bench.report import table  # noqa: E402
from specedge.export import export_bundle  # noqa: E402
from specedge.prompts import BUILTIN_PROMPTS  # noqa: E402
from specedge.runtime import load  # noqa: E402


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--policies", default="target,adaptive,fixed:4")
    args = parser.parse_args(argv)
    root = Path(args.out or tempfile.mkdtemp(prefix="tiny-useless-"))
    bundle = root / "bundle"
    if not (bundle / "manifest.json").exists():
        tok = byte_tokenizer()
        target = save(make_model("llama", len(tok), seed=1, layers=4), tok, root / "target")
        draft = save(make_model("llama", len(tok), seed=2, layers=2), tok, root / "draft")
        export_bundle(str(target), str(draft), bundle, max_seq_len=256, max_draft=8, progress=None, force=True)
    gen = load(bundle, prompt_cache=False)
    prompts = list(BUILTIN_PROMPTS[:3])
    results = run_bench(gen, prompts, args.policies.split(","), max_new_tokens=args.tokens, repeat=args.repeat)
    print(table(results))
    target = results["policies"]["target"]["tok_per_s"]
    for name, entry in results["policies"].items():
        print(f"{name:<12} {entry['tok_per_s']:8.1f} tok/s  {entry['tok_per_s'] / target:5.3f}x target-only  "
              f"mean k {entry['k_mean']:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
