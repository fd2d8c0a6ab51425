"""`make demo`: fetch the real pair, export it once, and compare speculative with target-only decoding.

    python -m specedge.demo [--models DIR] [--bundle DIR] [--max-new-tokens 64] [--k 4] [--repeat 1]
"""

from __future__ import annotations

import resource
import statistics
import sys
import time
from pathlib import Path

import click

from specedge.bench.runner import BUILTIN_PROMPTS
from specedge.errors import SpecedgeError

PROMPTS = [row["prompt"] for row in BUILTIN_PROMPTS[:3]]   # the code-completion ones


def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


@click.command()
@click.option("--models", default=None, type=click.Path(file_okay=False), help="Where the GGUF files go.")
@click.option("--bundle", default="bundles/qwen2.5-coder-1.5b+0.5b", show_default=True, type=click.Path())
@click.option("--max-new-tokens", default=64, show_default=True)
@click.option("--k", "k", default=4, show_default=True)
@click.option("--repeat", default=1, show_default=True, help="Runs per prompt and mode (medians are shown).")
def demo(models, bundle, max_new_tokens, k, repeat):
    from specedge.fetch import DEFAULT_DEST, fetch_pair
    from specedge.runtime import load
    from specedge.runtime.manifest import read_manifest

    click.echo("== 1. fetch Qwen2.5-Coder-1.5B-Instruct (target) and 0.5B-Instruct (draft), GGUF Q4_K_M")
    target, draft = fetch_pair(Path(models) if models else DEFAULT_DEST)
    bundle = Path(bundle)
    click.echo(f"== 2. export to {bundle} (fp32 ONNX, checked against transformers)")
    try:
        read_manifest(bundle)
        click.echo(f"ok   {bundle} (already exported; delete it to export again)")
    except SpecedgeError:
        from specedge.export import export_bundle
        export_bundle(str(target), str(draft), bundle, max_seq_len=2048, max_draft=8, force=bundle.exists())
    click.echo("== 3. load")
    t = time.perf_counter()
    gen = load(bundle)
    click.echo(f"ok   loaded in {time.perf_counter() - t:.1f}s, peak RSS {_peak_rss_gib():.1f} GiB")
    click.echo(f"== 4. generate (greedy, {max_new_tokens} new tokens per prompt, k={k} vs target alone)")
    gen.generate(PROMPTS[0], max_new_tokens=4, k=k)                          # warm-up
    rows = {"target": [], f"k={k}": []}
    for prompt in PROMPTS:
        for _ in range(repeat):
            base = gen.generate(prompt, max_new_tokens=max_new_tokens, k=0, use_draft=False, ignore_eos=True)
            spec = gen.generate(prompt, max_new_tokens=max_new_tokens, k=k, ignore_eos=True)
            rows["target"].append(base.stats)
            rows[f"k={k}"].append(spec.stats)
            if spec.tokens != base.tokens:
                raise SpecedgeError("speculative output differs from target-only output (please report this)")
        click.echo(f"--- prompt: {prompt.splitlines()[0]!r}")
        click.echo(prompt + spec.text)
    click.echo("== 5. stats (medians over prompts; greedy outputs identical: yes)")
    click.echo(f"{'mode':<8} {'tok/s':>7} {'speedup':>8} {'mean acc len':>13} {'target calls/token':>19} "
               f"{'draft s':>8} {'verify s':>9}")
    base_tps = statistics.median(s.tokens_per_s for s in rows["target"])
    for mode, runs in rows.items():
        tps = statistics.median(s.tokens_per_s for s in runs)
        calls = statistics.median((s.n_target_calls + 1) / s.new_tokens for s in runs)
        click.echo(f"{mode:<8} {tps:7.2f} {tps / base_tps:7.2f}x "
                   f"{statistics.median(s.mean_accepted_length for s in runs):13.2f} {calls:19.2f} "
                   f"{statistics.median(s.draft_s for s in runs):8.2f} {statistics.median(s.verify_s for s in runs):9.2f}")
    per_pos = [statistics.median(s.acceptance_per_position[i] for s in rows[f"k={k}"]
                                 if len(s.acceptance_per_position) > i) for i in range(k)]
    click.echo(f"acceptance per draft position (k={k}): " + " ".join(f"{a:.2f}" for a in per_pos))
    click.echo(f"peak RSS {_peak_rss_gib():.1f} GiB")


def main() -> int:
    try:
        demo.main(standalone_mode=False)
    except click.ClickException as err:
        click.echo(f"specedge demo: error: {err.format_message()}", err=True)
        return 2
    except SpecedgeError as err:
        click.echo(f"specedge demo: error: {err}", err=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
