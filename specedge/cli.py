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
    help="Rows a lone target token runs as. auto: the fastest that keeps speculative greedy output identical "
         "to target-only output on this CPU; 1: always one row (faster plain decoding where auto picks 2, but "
         "no longer exact against speculation there); 2: always padded.")
backend_option = click.option("--backend", default="cpu", show_default=True,
                              help="Where the models run: cpu (onnxruntime CPU provider).")
threads_option = click.option("--threads", default=None, type=click.IntRange(min=1),
                              help="onnxruntime intra-op threads (default: all cores).")
POSITIVE = click.IntRange(min=1)
NON_NEGATIVE = click.IntRange(min=0)
SEED = click.IntRange(0, 2**63 - 1)


@click.group()
@click.version_option(package_name="specedge")
def cli():
    """specedge: exact speculative decoding on one local machine."""


@cli.command()
@click.option("--target", required=True, help="Target model: Hugging Face folder, hub id, or .gguf file.")
@click.option("--draft", required=True, help="Draft model (same vocabulary), or 'none' for a target-only bundle.")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Bundle folder to write.")
@click.option("--max-seq-len", default=2048, show_default=True, type=POSITIVE, help="KV buffer length (prompt + output).")
@click.option("--max-draft", default=8, show_default=True, type=POSITIVE, help="Largest k the runtime may use.")
@click.option("--tolerance", type=click.FloatRange(min=0), default=None,
              help="Max logit error allowed in the export check.")
@click.option("--quantize", default="none", show_default=True, type=click.Choice(["none", "int4", "int8"]),
              help="Weight-only quantization (MatMulNBits) of the target, and of the draft unless --draft-quantize.")
@click.option("--draft-quantize", default=None, type=click.Choice(["none", "int4", "int8"]),
              help="Quantization of the draft [default: as --quantize].")
@click.option("--block-size", default=32, show_default=True, type=click.IntRange(min=16),
              help="Quantization block size along K.")
@click.option("--accuracy-level", default=4, show_default=True, type=click.IntRange(0, 4),
              help="MatMulNBits compute: 4 = int8 activations (fast, rows independent), 0 = float.")
@click.option("--attention", default="gqa", show_default=True, type=click.Choice(["gqa", "standard"]),
              help="Step-graph attention: gqa = GroupQueryAttention in place, valid length only, one row per call; "
                   "standard = standard ONNX ops (TensorScatter in place), batches of any size.")
@click.option("--draft-vocab", type=POSITIVE, default=None,
              help="Keep only the N most frequent tokens in the draft's LM head (needs --draft-vocab-from).")
@click.option("--draft-vocab-from", type=click.Path(), default=None,
              help="Corpus for --draft-vocab: a text file, a JSONL of prompts, or a folder of source files.")
@click.option("--quantize-embeddings/--no-quantize-embeddings", default=None,
              help="Quantize the embedding tables of quantized models too (GatherBlockQuantized) "
                   "[default: on with --quantize or --draft-quantize].")
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
@click.option("--max-new-tokens", default=128, show_default=True, type=POSITIVE)
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(min=0), help="0 = greedy.")
@click.option("--top-k", default=0, show_default=True, type=NON_NEGATIVE, help="0 = off.")
@click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0, 1, min_open=True), help="1 = off.")
@click.option("--seed", default=None, type=SEED, help="Makes a sampled run reproducible.")
@click.option("--k", "k", default=4, show_default=True, type=NON_NEGATIVE, help="Draft tokens per verify call.")
@click.option("--no-draft", is_flag=True, help="Target alone (the baseline).")
@click.option("--policy", default=None,
              help="How many to draft: fixed:K | heuristic | adaptive | adaptive:stop | target (default: fixed --k).")
@click.option("--drafter", default="model", show_default=True, type=click.Choice(["model", "ngram", "hybrid"]),
              help="Who drafts: the draft model, prompt lookup (ngram), or lookup where the text repeats (hybrid).")
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--ignore-eos", is_flag=True, help="Keep generating past end-of-sequence tokens.")
@threads_option
@backend_option
@target_rows_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: text, tokens, prompt_tokens, stats.")
def generate(bundle, prompt, chat, max_new_tokens, temperature, top_k, top_p, seed, k, no_draft, policy, drafter,
             stop, ignore_eos, threads, backend, target_rows, as_json):
    """Generate a completion, streaming it, then print the stats."""
    from specedge.runtime import load

    if prompt == "-":
        prompt = sys.stdin.read()
    gen = load(bundle, backend=backend, threads=threads, target_rows=_rows(target_rows))
    options = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                   k=0 if no_draft else k, use_draft=not no_draft, stop=stop, chat=chat, ignore_eos=ignore_eos,
                   policy=policy, drafter=drafter)
    if as_json:
        result = gen.generate(prompt, **options)
        click.echo(json.dumps(result.to_json(gen.decode), ensure_ascii=False))
        return
    stream = gen.stream(prompt, **options)
    for piece in stream:
        click.echo(piece, nl=False)
    click.echo()
    click.echo(format_stats(stream.result.stats.to_json(gen.decode)), err=True)
    slots = ", ".join(f"{role} {size / 2**20:.1f} MiB" for role, size in gen.kv_slot_bytes.items())
    click.echo(f"   KV memory per slot (one per concurrent sequence): {slots}", err=True)


@cli.command()
@click.argument("bundle", type=click.Path())
@click.option("--prompts", "prompts_file", default=None, type=click.Path(dir_okay=False),
              help="JSONL, one {\"prompt\": ..., \"chat\": false} per line (default: a built-in code set).")
@click.option("--policies", default=None,
              help="Comma-separated POLICY[@DRAFTER] (default: all; 'target' is always run).")
@click.option("--batch", "batches", default="1", show_default=True,
              help="Comma-separated concurrent sequences, e.g. 1,2,4,8 (a bundle exported with --attention "
                   "standard runs batches).")
@click.option("--max-new-tokens", default=128, show_default=True, type=POSITIVE)
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(min=0))
@click.option("--seed", default=None, type=SEED)
@click.option("--repeat", default=1, show_default=True, type=POSITIVE)
@click.option("--out", default="bench-out", show_default=True, type=click.Path(file_okay=False))
@threads_option
@backend_option
@target_rows_option
def bench(bundle, prompts_file, policies, batches, max_new_tokens, temperature, seed, repeat, out, threads, backend,
          target_rows):
    """Run every policy on the same prompts, side by side, and report acceptance, speed and time split."""
    from specedge.bench import load_prompts, parse_batches, run_bench, run_batch_bench
    from specedge.bench.report import batch_plots, batch_table, plots, table
    from specedge.bench.runner import DEFAULT_POLICIES, write_results
    from specedge.runtime import load

    sizes = parse_batches(batches)
    names = [p.strip() for p in (policies or DEFAULT_POLICIES).split(",") if p.strip()]
    prompts = load_prompts(prompts_file)
    gen = load(bundle, backend=backend, threads=threads, target_rows=_rows(target_rows), max_batch=max(sizes))
    if gen.draft is None:
        names = [n for n in names if n.split("@")[0] == "target" or n.endswith("@ngram")]

    def progress(done, total, label):
        width = 30
        bar = "#" * (width * done // total) + "." * (width - width * done // total)
        click.echo(f"\r[{bar}] {done}/{total} {label:<60}", err=True, nl=done == total)

    out = Path(out)
    if sizes == [1]:
        results = run_bench(gen, prompts, names, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                            repeat=repeat, progress=progress)
        text, draw = table(results), plots
    else:
        results = run_batch_bench(gen, prompts, names, sizes, max_new_tokens=max_new_tokens, temperature=temperature,
                                  seed=seed, repeat=repeat, progress=progress)
        text, draw = batch_table(results), batch_plots
    path = write_results(results, out)
    click.echo(text)
    written = draw(results, out)
    if written is None:
        click.echo("plots skipped: matplotlib is not installed (pip install 'specedge[plots]')", err=True)
    click.echo(f"wrote {path}" + (f" and {len(written)} plots" if written else ""), err=True)


@cli.command()
@click.argument("bundle", type=click.Path())
@click.option("--verify", is_flag=True, help="Also check every file's SHA-256 and the target's row exactness here.")
@backend_option
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
def inspect(bundle, verify, backend, as_json):
    """Describe a bundle: models, shapes, vocabulary, memory per slot, export checks."""
    from specedge.runtime.manifest import read_manifest

    manifest = read_manifest(bundle, verify_hashes=verify)
    rows_equal = min_rows = None
    if verify:
        from specedge.runtime.row_check import bundle_rows_bitwise_equal
        rows_equal, min_rows = bundle_rows_bitwise_equal(Path(bundle), manifest, backend=backend)
    if as_json:
        here = {"verify_rows_bitwise_equal_here": rows_equal, "target_min_rows_here": min_rows, "backend": backend}
        click.echo(json.dumps({**manifest, **here} if verify else manifest, indent=2))
        return
    click.echo(describe(manifest, verified=verify))
    if verify:
        click.echo(f"  target verify rows bitwise equal to single steps on this machine ({backend}): " +
                   (f"yes (a lone token as {min_rows} row{'s' if min_rows > 1 else ''})" if rows_equal else
                    "NO (greedy speculative output may differ from target-only output at near-ties)"))


def _rows(choice: str) -> str | int:
    return choice if choice == "auto" else int(choice)


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
    from specedge.runtime.memory import kv_slot_bytes, memory_report

    lines = [f"specedge bundle, format {m['format_version']} (specedge {m.get('specedge_version', '?')})",
             f"  vocab {m['vocab_size']}, max_seq_len {m['max_seq_len']}, max_draft {m['max_draft']}, "
             f"dtype {m['dtype']}, eos ids {m['eos_token_ids']}",
             f"  chat template: {'yes' if m['tokenizer'].get('chat_template') else 'no'}"]
    for role, model in m["models"].items():
        spec, check = model["spec"], model.get("export_check", {})
        kv_bytes = kv_slot_bytes(m, role)
        lines += [
            f"  {role}: {model['architecture']} from {model['source']} ({model['graph_variant']}, "
            f"{'any batch' if model.get('max_batch') is None else 'one row per call'})",
            f"    {spec['num_layers']} layers, hidden {spec['hidden_size']}, heads {spec['num_heads']}/"
            f"{spec['num_kv_heads']} kv, head_dim {spec['head_dim']}",
            f"    weights {model.get('weights', 'float32')} {model['weight_bytes'] / 2**20:.1f} MiB "
            f"({_embedding_line(model)}), KV {kv_bytes / 2**20:.1f} MiB per slot",
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
    lines.append(f"  memory: weights + KV of one slot {total / 2**30:.2f} GiB at max_seq_len {m['max_seq_len']} "
                 "(each further concurrent sequence, --max-batch, adds one slot per model)")
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
