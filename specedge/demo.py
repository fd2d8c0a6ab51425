"""`make demo`: fetch the real pair, measure the exact configurations that suit a CPU, run the fastest.

    python -m specedge.demo [--models DIR] [--bundles DIR] [--max-new-tokens 64] [--repeat 1]

Candidates (each bundle is exported once, then reused):
  fp32 target + int4 draft, adaptive   the fp32 target's output, token for token
  int4 target + int4 draft, adaptive   the int4 target's output, token for token
  int4 target alone                    the int4 baseline
Which one wins depends on the CPU (an fp32 step is memory-bound, so verifying several tokens is nearly free;
an int4 step is compute-bound on AVX2, so it is not), so the demo measures them side by side with the same
code `specedge bench` runs, picks the fastest whose speculative output equals its own target-only output, and
says why.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from specedge.errors import SpecedgeError
from specedge.prompts import BUILTIN_PROMPTS

PROMPTS = BUILTIN_PROMPTS[:3]          # the code-completion ones
# name -> (bundle folder, export options, configuration measured)
CANDIDATES = {
    "fp32 target + int4 draft, adaptive": ("fp32-int4draft", {"draft_quantize": "int4"}, "adaptive"),
    "int4 target + int4 draft, adaptive": ("int4", {"quantize": "int4"}, "adaptive"),
    "int4 target alone": ("int4", {"quantize": "int4"}, "target"),
}


def _bundle(folder: Path, options: dict, target: Path, draft: Path) -> Path:
    from specedge.runtime.manifest import read_manifest

    try:
        read_manifest(folder)
        click.echo(f"ok   {folder} (already exported; delete it to export again)")
    except SpecedgeError:
        from specedge.export import export_bundle
        export_bundle(str(target), str(draft), folder, max_seq_len=2048, max_draft=8, force=folder.exists(),
                      progress=lambda line: click.echo(f"     {line}"), **options)
    return folder


def _measure(folder: Path, max_new_tokens: int, repeat: int) -> dict:
    """target and adaptive on the demo prompts -> bench results (one bundle loaded at a time)."""
    from specedge.bench import run_bench
    from specedge.runtime import load

    gen = load(folder)
    results = run_bench(gen, list(PROMPTS), ["target", "adaptive"], max_new_tokens=max_new_tokens, repeat=repeat)
    gen.close()
    return results


@click.command()
@click.option("--models", default=None, type=click.Path(file_okay=False), help="Where the GGUF files go.")
@click.option("--bundles", default="bundles", show_default=True, type=click.Path(file_okay=False))
@click.option("--max-new-tokens", default=64, show_default=True, type=click.IntRange(min=1))
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(min=1),
              help="Runs per prompt and configuration (medians are shown).")
def demo(models, bundles, max_new_tokens, repeat):
    from specedge.fetch import DEFAULT_DEST, fetch_pair
    from specedge.runtime import load
    from specedge.runtime.memory import peak_rss_bytes

    click.echo("== 1. fetch Qwen2.5-Coder-1.5B-Instruct (target) and 0.5B-Instruct (draft), GGUF Q4_K_M")
    target, draft = fetch_pair(Path(models) if models else DEFAULT_DEST)
    click.echo("== 2. export the candidate bundles (checked against transformers)")
    folders = {}
    for name, (folder, options, _) in CANDIDATES.items():
        if folder not in folders:
            folders[folder] = _bundle(Path(bundles) / f"qwen2.5-coder-{folder}", options, target, draft)
    click.echo(f"== 3. measure every candidate (greedy, {max_new_tokens} tokens, {len(PROMPTS)} prompts, "
               "the same code as `specedge bench`)")
    measured = {folder: _measure(path, max_new_tokens, repeat) for folder, path in folders.items()}
    rows = []
    for name, (folder, _, config) in CANDIDATES.items():
        policies = measured[folder]["policies"]
        entry, own_target = policies[config], policies["target"]
        exact = config == "target" or entry["identical_to_target"] is True
        rows.append((name, folder, config, entry["tok_per_s"], own_target["tok_per_s"], exact,
                     entry["mean_accepted_length"]))
    click.echo(f"{'configuration':<38} {'tok/s':>7} {'its target alone':>17} {'speedup':>8} {'acc len':>8} {'exact':>6}")
    for name, _, config, tps, base, exact, acc in rows:
        click.echo(f"{name:<38} {tps:7.2f} {base:17.2f} {tps / base:7.2f}x "
                   f"{acc if config != 'target' else float('nan'):8.2f} {'yes' if exact else 'NO':>6}")
    best = max((row for row in rows if row[5]), key=lambda row: row[3])
    name, folder, config, tps, base, _, _ = best
    others = ", ".join(f"{n} {t:.2f}" for n, _, _, t, _, e, _ in rows if n != name and e)
    click.echo(f"picked: {name}: {tps:.2f} tok/s, the fastest exact configuration on this machine "
               f"(others: {others} tok/s); {tps / base:.2f}x its own target alone")
    click.echo(f"== 4. generate with it ({folders[folder]})")
    gen = load(folders[folder])
    completions = []
    for row in PROMPTS:
        click.echo(f"--- prompt: {row['prompt'].splitlines()[0]!r}")
        stream = gen.stream(row["prompt"], max_new_tokens=max_new_tokens, policy=config)
        click.echo(row["prompt"], nl=False)
        for piece in stream:
            click.echo(piece, nl=False)
        s = stream.result.stats
        completions.append(row["prompt"] + stream.result.text)
        click.echo(f"\n    {s.new_tokens} tokens, {s.tokens_per_s:.2f} tok/s, mean accepted length "
                   f"{s.mean_accepted_length:.2f}, acceptance per position "
                   + (" ".join(f"{a:.2f}" for a in s.acceptance_per_position) or "-"))
    if gen.chat_template:
        click.echo("== 5. a conversation about that code: each turn sends the whole history, and the prompt cache "
                   "prefills only what is new")
        _conversation(gen, completions[0], dict(max_new_tokens=max_new_tokens, policy=config))
    click.echo(f"peak RSS {peak_rss_bytes() / 2**30:.1f} GiB")


def _conversation(gen, code: str, options: dict) -> None:
    """Two chat turns, each streamed, then how much of its prompt came from the cache and when its text began."""
    import time

    messages = [{"role": "user", "content": f"Here is some code:\n```python\n{code}\n```\nWhat does it do? One "
                                            "sentence."}]
    for follow_up in (None, "Suggest one improvement, in one sentence."):
        if follow_up:
            messages += [{"role": "user", "content": follow_up}]
        click.echo(f"--- user: {messages[-1]['content'].splitlines()[-1]}")
        t, first = time.perf_counter(), None
        stream = gen.stream_chat(messages, **options)
        for piece in stream:
            if piece and first is None:
                first = time.perf_counter() - t
            click.echo(piece, nl=False)
        s = stream.result.stats
        click.echo(f"\n    prompt {s.prompt_tokens} tokens, {s.cached_prompt_tokens} of them from the cache; first "
                   f"text after {first or 0:.2f} s; {s.tokens_per_s:.2f} tok/s")
        messages.append({"role": "assistant", "content": stream.result.text})


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
