"""Command line: parse, call the library, print. Errors are one line on stderr and a non-zero exit."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from specedge.errors import OptionError, SpecedgeError

EXIT_USAGE, EXIT_FAILURE = 2, 1


target_rows_option = click.option(
    "--target-rows", default="auto", show_default=True, type=click.Choice(["auto", "1", "2"]),
    help="Rows a single step of a quantized target runs as. auto: the fastest that keeps speculative greedy "
         "output identical to target-only output on this CPU; 1: always one row (faster plain decoding where "
         "auto picks 2, but no longer exact against speculation there).")


@click.group()
@click.version_option(package_name="specedge")
def cli():
    """specedge: exact speculative decoding on one local machine."""


@cli.command()
@click.option("--target", required=True, help="Target model: Hugging Face folder, hub id, or .gguf file.")
@click.option("--draft", required=True, help="Draft model (same vocabulary), or 'none' for a target-only bundle.")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Bundle folder to write.")
@click.option("--max-seq-len", default=2048, show_default=True, type=int, help="KV buffer length (prompt + output).")
@click.option("--max-draft", default=8, show_default=True, type=int, help="Largest k the runtime may use.")
@click.option("--tolerance", type=float, default=None, help="Max logit error allowed in the export check.")
@click.option("--quantize", default="none", show_default=True, type=click.Choice(["none", "int4", "int8"]),
              help="Weight-only quantization (MatMulNBits) of the target, and of the draft unless --draft-quantize.")
@click.option("--draft-quantize", default=None, type=click.Choice(["none", "int4", "int8"]),
              help="Quantization of the draft [default: as --quantize].")
@click.option("--block-size", default=32, show_default=True, type=int, help="Quantization block size along K.")
@click.option("--accuracy-level", default=4, show_default=True, type=click.IntRange(0, 4),
              help="MatMulNBits compute: 4 = int8 activations (fast, rows independent), 0 = float.")
@click.option("--attention", default="gqa", show_default=True, type=click.Choice(["gqa", "scatter"]),
              help="Step-graph attention: gqa = in-place KV, valid length only; scatter = copy of the whole buffer.")
@click.option("--draft-vocab", type=int, default=None,
              help="Keep only the N most frequent tokens in the draft's LM head (needs --draft-vocab-from).")
@click.option("--draft-vocab-from", type=click.Path(), default=None,
              help="Corpus for --draft-vocab: a text file, a JSONL of prompts, or a folder of source files.")
@click.option("--quantize-embeddings", is_flag=True,
              help="Quantize the embedding tables of quantized models too (GatherBlockQuantized).")
@click.option("--force", is_flag=True, help="Replace an existing bundle at --out.")
def export(target, draft, out, max_seq_len, max_draft, tolerance, quantize, draft_quantize, block_size,
           accuracy_level, attention, draft_vocab, draft_vocab_from, quantize_embeddings, force):
    """Export a target and a draft model into a bundle."""
    try:
        from specedge.export import export_bundle
    except ImportError as err:
        raise SpecedgeError(f"the exporter needs the 'export' extra (missing {err.name}): "
                            "pip install 'specedge[export]'") from err
    draft = None if draft.lower() == "none" else draft
    export_bundle(target, draft, out, max_seq_len=max_seq_len, max_draft=max_draft, tolerance=tolerance,
                  force=force, progress=lambda line: click.echo(line, err=True), quantize=quantize,
                  draft_quantize=draft_quantize, block_size=block_size, accuracy_level=accuracy_level,
                  attention=attention, draft_vocab=draft_vocab, draft_vocab_from=draft_vocab_from,
                  quantize_embeddings=quantize_embeddings)


@cli.command()
@click.argument("bundle", type=click.Path())
@click.option("--prompt", required=True, help="Prompt text ('-' reads it from stdin).")
@click.option("--chat", is_flag=True, help="Wrap the prompt in the bundle's chat template.")
@click.option("--max-new-tokens", default=128, show_default=True, type=int)
@click.option("--temperature", default=0.0, show_default=True, type=float, help="0 = greedy.")
@click.option("--top-k", default=0, show_default=True, type=int, help="0 = off.")
@click.option("--top-p", default=1.0, show_default=True, type=float, help="1 = off.")
@click.option("--seed", default=None, type=int, help="Makes a sampled run reproducible.")
@click.option("--k", "k", default=4, show_default=True, type=int, help="Draft tokens per verify call.")
@click.option("--no-draft", is_flag=True, help="Target alone (the baseline).")
@click.option("--policy", default=None,
              help="fixed:K | heuristic | adaptive | ngram[:K] | hybrid[:K] | target (default: fixed --k).")
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--ignore-eos", is_flag=True, help="Keep generating past end-of-sequence tokens.")
@click.option("--threads", default=None, type=int, help="onnxruntime intra-op threads (default: all cores).")
@target_rows_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: text, tokens, prompt_tokens, stats.")
def generate(bundle, prompt, chat, max_new_tokens, temperature, top_k, top_p, seed, k, no_draft, policy, stop,
             ignore_eos, threads, target_rows, as_json):
    """Generate a completion, streaming it, then print the stats."""
    from specedge.runtime import load

    _check_sampling(max_new_tokens, temperature, top_k, top_p, k, threads)
    if prompt == "-":
        prompt = sys.stdin.read()
    gen = load(bundle, threads=threads, target_rows=_rows(target_rows))
    options = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                   k=0 if no_draft else k, use_draft=not no_draft, stop=stop, chat=chat, ignore_eos=ignore_eos,
                   policy=policy)
    if as_json:
        result = gen.generate(prompt, **options)
        click.echo(json.dumps(result.to_json(gen.decode), ensure_ascii=False))
        return
    for piece in gen.stream(prompt, **options):
        click.echo(piece, nl=False)
    click.echo()
    click.echo(format_stats(gen.last_result.stats.to_json(gen.decode)), err=True)


@cli.command()
@click.argument("bundle", type=click.Path())
@click.option("--prompts", "prompts_file", default=None, type=click.Path(dir_okay=False),
              help="JSONL, one {\"prompt\": ..., \"chat\": false} per line (default: a built-in code set).")
@click.option("--policies", default=None, help="Comma-separated (default: all; 'target' is always run).")
@click.option("--max-new-tokens", default=128, show_default=True, type=int)
@click.option("--temperature", default=0.0, show_default=True, type=float)
@click.option("--seed", default=None, type=int)
@click.option("--repeat", default=1, show_default=True, type=int)
@click.option("--out", default="bench-out", show_default=True, type=click.Path(file_okay=False))
@click.option("--threads", default=None, type=int)
@target_rows_option
def bench(bundle, prompts_file, policies, max_new_tokens, temperature, seed, repeat, out, threads, target_rows):
    """Run every policy on the same prompts, side by side, and report acceptance, speed and time split."""
    from specedge.bench import load_prompts, run_bench
    from specedge.bench.report import plots, table
    from specedge.bench.runner import DEFAULT_POLICIES, write_results
    from specedge.runtime import load

    _check_sampling(max_new_tokens, temperature, 0, 1.0, 0, threads)
    if repeat < 1:
        raise click.BadParameter(f"must be >= 1, got {repeat}", param_hint="--repeat")
    names = [p.strip() for p in (policies or DEFAULT_POLICIES).split(",") if p.strip()]
    prompts = load_prompts(prompts_file)
    gen = load(bundle, threads=threads, target_rows=_rows(target_rows))
    if gen.draft is None:
        names = [n for n in names if n.split(":")[0] in ("target", "ngram")]

    def progress(done, total, label):
        width = 30
        bar = "#" * (width * done // total) + "." * (width - width * done // total)
        click.echo(f"\r[{bar}] {done}/{total} {label:<60}", err=True, nl=done == total)

    results = run_bench(gen, prompts, names, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                        repeat=repeat, progress=progress)
    out = Path(out)
    path = write_results(results, out)
    click.echo(table(results))
    written = plots(results, out)
    if written is None:
        click.echo("plots skipped: matplotlib is not installed (pip install 'specedge[plots]')", err=True)
    click.echo(f"wrote {path}" + (f" and {len(written)} plots" if written else ""), err=True)


@cli.command()
@click.argument("bundle", type=click.Path())
@click.option("--verify", is_flag=True, help="Also check every file's SHA-256.")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
def inspect(bundle, verify, as_json):
    """Describe a bundle: models, shapes, vocabulary, export checks."""
    from specedge.runtime.manifest import read_manifest

    manifest = read_manifest(bundle, verify_hashes=verify)
    rows_equal = min_rows = None
    if verify:
        from specedge.runtime.row_check import bundle_rows_bitwise_equal
        rows_equal, min_rows = bundle_rows_bitwise_equal(Path(bundle), manifest)
    if as_json:
        here = {"verify_rows_bitwise_equal_here": rows_equal, "target_min_rows_here": min_rows}
        click.echo(json.dumps({**manifest, **here} if verify else manifest, indent=2))
        return
    click.echo(describe(manifest, verified=verify))
    if verify:
        click.echo("  target verify rows bitwise equal to single steps on this machine: " +
                   (f"yes (single steps as {min_rows} row{'s' if min_rows > 1 else ''})" if rows_equal else
                    "NO (greedy speculative output may differ from target-only output at near-ties)"))


def _rows(choice: str) -> str | int:
    return choice if choice == "auto" else int(choice)


def _check_sampling(max_new_tokens, temperature, top_k, top_p, k, threads):
    if max_new_tokens < 1:
        raise click.BadParameter(f"must be at least 1, got {max_new_tokens}", param_hint="--max-new-tokens")
    if temperature < 0:
        raise click.BadParameter(f"must be >= 0, got {temperature}", param_hint="--temperature")
    if top_k < 0:
        raise click.BadParameter(f"must be >= 0, got {top_k}", param_hint="--top-k")
    if not 0 < top_p <= 1:
        raise click.BadParameter(f"must be in (0, 1], got {top_p}", param_hint="--top-p")
    if k < 0:
        raise click.BadParameter(f"must be >= 0, got {k}", param_hint="--k")
    if threads is not None and threads < 1:
        raise click.BadParameter(f"must be >= 1, got {threads}", param_hint="--threads")


def format_stats(s: dict) -> str:
    per_pos = " ".join(f"{a:.2f}" for a in s["acceptance_per_position"]) or "-"
    t = s["time_s"]
    lines = [
        f"-- {s['new_tokens']} tokens in {t['total']:.2f}s = {s['tokens_per_s']:.2f} tok/s "
        f"(prompt {s['prompt_tokens']} tokens, stop: {s['stop_reason']})",
        f"   drafted {s['drafted_tokens']}, accepted {s['accepted_tokens']} "
        f"({100 * s['acceptance_rate']:.1f}%), mean accepted length {s['mean_accepted_length']:.2f}, "
        f"verify calls {s['verify_calls']}, target calls {s['target_calls']}",
        f"   acceptance per draft position: {per_pos}",
        f"   time: prefill {t['prefill']:.2f}s, draft {t['draft']:.2f}s, verify {t['verify']:.2f}s, "
        f"other {t['other']:.2f}s",
    ]
    return "\n".join(lines)


def describe(m: dict, verified: bool = False) -> str:
    from specedge.runtime.memory import kv_buffer_bytes, memory_report

    lines = [f"specedge bundle, format {m['format_version']} (specedge {m.get('specedge_version', '?')})",
             f"  vocab {m['vocab_size']}, max_seq_len {m['max_seq_len']}, max_draft {m['max_draft']}, "
             f"dtype {m['dtype']}, eos ids {m['eos_token_ids']}",
             f"  chat template: {'yes' if m['tokenizer'].get('chat_template') else 'no'}"]
    for role, model in m["models"].items():
        spec, check = model["spec"], model.get("export_check", {})
        kv_bytes = kv_buffer_bytes(m, role)
        lines += [
            f"  {role}: {model['architecture']} from {model['source']} ({model['graph_variant']})",
            f"    {spec['num_layers']} layers, hidden {spec['hidden_size']}, heads {spec['num_heads']}/"
            f"{spec['num_kv_heads']} kv, head_dim {spec['head_dim']}",
            f"    weights {model.get('weights', 'float32')} {model['weight_bytes'] / 2**20:.1f} MiB "
            f"({_embedding_line(model)}), KV buffers {kv_bytes / 2**20:.1f} MiB",
            f"    export check: max logit error {check.get('max_abs_logit_error', float('nan')):.2e} "
            f"(tolerance {check.get('tolerance', float('nan')):.2e}), top-1 agreement "
            f"{check.get('top1_agreement', float('nan')):.3f}, verify rows bitwise equal: "
            f"{ {True: 'yes', False: 'NO'}.get(check.get('verify_rows_bitwise_equal'), '?') }",
        ]
        if "vocab_subset" in model:
            sub = model["vocab_subset"]
            lines.append(f"    LM head: {sub['size']} of {m['vocab_size']} tokens (from {sub['corpus']}, "
                         f"{100 * sub['corpus_coverage']:.1f}% of its tokens)")
        q = check.get("vs_source", check.get("vs_unquantized"))       # vs_unquantized: older bundles
        if q:
            lines.append(f"    vs source model: top-1 agreement {q['top1_agreement']:.3f} over {q['positions']} "
                         f"prompt positions, max logit error {q['max_abs_logit_error']:.3g}")
    total = memory_report(m)["total_bytes"]
    lines.append(f"  memory: weights + KV buffers {total / 2**30:.2f} GiB at max_seq_len {m['max_seq_len']}")
    lines.append(f"  files: {len(m['files'])}" + (", all checksums verified" if verified else ""))
    return "\n".join(lines)


def _embedding_line(model: dict) -> str:
    stored = "quantized" if model.get("quantization", {}).get("embedding") else "float32"
    size = model.get("embedding_bytes")
    return f"embedding {stored}" + (f" {size / 2**20:.1f} MiB" if size else "")


def main(argv=None) -> int:
    try:
        cli.main(args=argv, prog_name="specedge", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("specedge: aborted", err=True)
        return EXIT_FAILURE
    except click.ClickException as err:
        click.echo(f"specedge: error: {_one_line(err.format_message())}", err=True)
        return EXIT_USAGE
    except OptionError as err:
        click.echo(f"specedge: error: {_one_line(str(err))}", err=True)
        return EXIT_USAGE
    except SpecedgeError as err:
        click.echo(f"specedge: error: {_one_line(str(err))}", err=True)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        click.echo("specedge: interrupted", err=True)
        return 130
    return 0


def _one_line(text: str) -> str:
    return " ".join(text.split())


if __name__ == "__main__":
    sys.exit(main())
