"""Command line: parse, call the library, print. Errors are one line on stderr and a non-zero exit."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path

import click

from specedge.errors import NoDraftModel, OptionError, SpecedgeError
from specedge.interrupts import InterruptWatch
from specedge.limits import MAX_DRAFT_LIMIT, MAX_THREADS, MIN_SEQ_LEN

EXIT_USAGE, EXIT_FAILURE, EXIT_INTERRUPTED = 2, 1, 130


target_rows_option = click.option(
    "--target-rows", default="auto", show_default=True, type=click.Choice(["auto", "1", "2"]),
    help="Rows a lone target token runs as. auto: the fastest that keeps speculative greedy output identical "
         "to target-only output on this CPU; 1: always one row (faster plain decoding where auto picks 2, but "
         "no longer exact against speculation there); 2: rows in pairs (a lone token, an odd call padded).")
backend_option = click.option(
    "--backend", default="cpu", show_default=True, type=click.Choice(["cpu", "cuda", "tensorrt", "auto"]),
    help="Where the models run: cpu (onnxruntime CPU provider), cuda (onnxruntime-gpu; bundles exported with "
         "--attention standard), tensorrt (experimental: engines from `specedge build --tensorrt`), auto (the first "
         "of tensorrt, cuda, cpu available here that runs the bundle; it says which).")
device_id_option = click.option("--device-id", default=0, show_default=True, type=click.IntRange(min=0),
                                help="The GPU (GPU backends).")
cuda_graphs_option = click.option("--cuda-graphs/--no-cuda-graphs", default=True, show_default=True,
                                  help="Replay decode calls as CUDA graphs (GPU backends).")


def gpu_options(command):
    return device_id_option(cuda_graphs_option(command))


threads_option = click.option("--threads", default=None, type=click.IntRange(1, MAX_THREADS),
                              help="onnxruntime intra-op threads (default: all cores; at most 4x the cores).")
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
@click.option("--max-seq-len", default=2048, show_default=True, type=click.IntRange(min=MIN_SEQ_LEN),
              help="KV buffer length (prompt + output).")
@click.option("--max-draft", default=8, show_default=True, type=click.IntRange(1, MAX_DRAFT_LIMIT),
              help="Largest k the runtime may use.")
@click.option("--tolerance", type=click.FloatRange(min=0), default=None,
              help="Max logit error allowed in the export check.")
@click.option("--quantize", default="none", show_default=True, type=click.Choice(["none", "int4", "int8"]),
              help="Weight-only quantization (MatMulNBits) of the target, and of the draft unless --draft-quantize.")
@click.option("--draft-quantize", default=None, type=click.Choice(["none", "int4", "int8"]),
              help="Quantization of the draft [default: as --quantize].")
@click.option("--block-size", default=None, type=click.IntRange(16, 256),
              help="Quantization block size along K, a power of two [default: 32], for the draft too unless "
                   "--draft-block-size.")
@click.option("--draft-block-size", default=None, type=click.IntRange(16, 256),
              help="The draft's block size [default: --block-size if given, else the largest of 128, 64, 32 "
                   "dividing its matrices: a draft's blocks change its speed and acceptance, never the output].")
@click.option("--accuracy-level", default=4, show_default=True, type=click.IntRange(0, 4),
              help="MatMulNBits compute: 4 = int8 activations (fast, rows independent), 0 = float.")
@click.option("--rounding", default="minmax", show_default=True, type=click.Choice(["minmax", "lsq"]),
              help="How quantized blocks pick scale and zero point: minmax = the block's range; lsq = weighted "
                   "least squares (closer to the source's logits, not its perplexity; slower to export).")
@click.option("--attention", default=None, type=click.Choice(["gqa", "standard"]),
              help="Step-graph attention: gqa = GroupQueryAttention in place, valid length only, one row per call; "
                   "standard = standard ONNX ops (TensorScatter in place), batches of any size, the GPU backends "
                   "[default: gqa; standard with --dtype bf16].")
@click.option("--quantize-embeddings/--no-quantize-embeddings", default=None,
              help="Quantize the embedding tables of quantized models too (GatherBlockQuantized) "
                   "[default: on with --quantize or --draft-quantize].")
@click.option("--dtype", default="fp32", show_default=True, type=click.Choice(["fp32", "fp16", "bf16"]),
              help="Weights, activations and KV buffers (norms, softmax and logits stay float32). bf16 runs on GPU "
                   "backends only, fp16 on the CPU provider too; checked through a float32 copy plus a dtype audit.")
@click.option("--force", is_flag=True, help="Replace an existing bundle at --out.")
def export(target, draft, out, max_seq_len, max_draft, tolerance, quantize, draft_quantize, block_size,
           draft_block_size, accuracy_level, rounding, attention, quantize_embeddings, dtype, force):
    """Export a target and a draft model into a bundle."""
    try:
        from specedge.export import export_bundle
    except ImportError as err:
        raise SpecedgeError(f"the exporter needs the 'export' extra (missing {err.name}): "
                            "pip install 'specedge[export]'") from err
    draft = None if draft.lower() == "none" else draft
    # SIGTERM (a service manager, a timeout) ends the export as Ctrl+C does: its work folder is removed on the way out
    main_thread = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGTERM, _exit_on_sigterm) if main_thread else None
    try:
        export_bundle(target, draft, out, max_seq_len=max_seq_len, max_draft=max_draft, tolerance=tolerance,
                      force=force, progress=lambda line: click.echo(line, err=True), quantize=quantize,
                      draft_quantize=draft_quantize, block_size=block_size, draft_block_size=draft_block_size,
                      accuracy_level=accuracy_level, rounding=rounding, attention=attention,
                      quantize_embeddings=quantize_embeddings, dtype=dtype)
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, before)


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def _response_format(value: str | None) -> dict | None:
    """--response-format: "json" (any object) or a JSON schema file -> OpenAI's response_format."""
    if value is None:
        return None
    if value == "json":
        return {"type": "json_object"}
    try:
        schema = json.loads(Path(value).read_text())
    except (OSError, ValueError) as err:
        raise OptionError(f"--response-format: not 'json' and not a readable JSON schema file: {err}") from None
    if not isinstance(schema, (dict, bool)):
        raise OptionError(f"--response-format {value}: a JSON schema is an object, got {type(schema).__name__}")
    return {"type": "json_schema", "json_schema": {"name": Path(value).stem, "schema": schema}}


@cli.command()
@click.argument("bundle", type=click.Path())
@click.option("--prompt", required=True, help="Prompt text ('-' reads it from stdin).")
@click.option("--chat", is_flag=True, help="Wrap the prompt in the bundle's chat template.")
@click.option("--suffix", default=None,
              help="Fill in the middle: the code after the gap; the model writes what goes between prompt and suffix.")
@click.option("--max-new-tokens", default=128, show_default=True, type=POSITIVE)
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(min=0), help="0 = greedy.")
@click.option("--top-k", default=0, show_default=True, type=NON_NEGATIVE, help="0 = off.")
@click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0, 1, min_open=True), help="1 = off.")
@click.option("--seed", default=None, type=SEED, help="Makes a sampled run reproducible.")
@click.option("--k", "k", default=4, show_default=True, type=NON_NEGATIVE,
              help="Draft tokens per verify call (the default is capped by the bundle's max_draft).")
@click.option("--no-draft", is_flag=True, help="Target alone (the baseline).")
@click.option("--policy", default=None,
              help="How many to draft: fixed:K | heuristic | adaptive | adaptive:stop | target (default: fixed --k).")
@click.option("--drafter", default="model", show_default=True, type=click.Choice(["model", "ngram", "hybrid"]),
              help="Who drafts: the draft model, prompt lookup (ngram), or lookup where the text repeats (hybrid).")
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--ignore-eos", is_flag=True, help="Keep generating past end-of-sequence tokens.")
@click.option("--response-format", default=None, metavar="json|SCHEMA.json",
              help="Structured output: any JSON object (json), or JSON that a JSON schema file describes "
                   "(with --chat on a thinking template: after the </think>).")
@threads_option
@backend_option
@gpu_options
@target_rows_option
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object: text, tokens, prompt_tokens, stats (and logprobs with --logprobs).")
@click.option("--logprobs", default=None, type=click.IntRange(0, 20),
              help="With --json: each generated token's logprob under the target and the N likeliest tokens there.")
def generate(bundle, prompt, chat, suffix, max_new_tokens, temperature, top_k, top_p, seed, k, no_draft, policy,
             drafter, stop, ignore_eos, response_format, threads, backend, device_id, cuda_graphs, target_rows, as_json,
             logprobs):
    """Generate a completion, streaming it, then print the stats."""
    from specedge.runtime import load

    if logprobs is not None and not as_json:
        raise OptionError("--logprobs goes with --json (the logprobs are a field of its output)")
    if prompt == "-":
        prompt = sys.stdin.read()
    gen = load(bundle, backend=backend, threads=threads, target_rows=_rows(target_rows), device_id=device_id,
               cuda_graphs=cuda_graphs)
    if gen.backend_choice:
        click.echo(gen.backend_choice, err=True)
    asked = click.get_current_context().get_parameter_source
    if gen.draft is None and not no_draft and policy is None and drafter == "model" and \
            asked("k") == click.core.ParameterSource.DEFAULT:        # as `serve` does; an explicit --k still errs
        click.echo("this bundle has no draft model: the target runs alone", err=True)   # the runtime's default
    options = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                   use_draft=not no_draft, stop=stop, chat=chat, ignore_eos=ignore_eos, policy=policy, drafter=drafter,
                   logprobs=logprobs, response_format=_response_format(response_format))
    if no_draft or asked("k") != click.core.ParameterSource.DEFAULT:
        options["k"] = 0 if no_draft else k          # else the runtime's default, capped by the bundle's max_draft
    if as_json:
        result = gen.generate(prompt, suffix=suffix, **options)
        click.echo(json.dumps(result.to_json(gen.decode), ensure_ascii=not _utf8(sys.stdout)))   # lossless either way
        return
    stream = gen.stream(prompt, suffix=suffix, **options)
    for piece in stream:
        click.echo(piece, nl=False)
    click.echo()
    click.echo(format_stats(stream.result.stats.to_json(gen.decode)), err=True)
    slots = ", ".join(f"{role} {_size(size)}" for role, size in gen.kv_slot_bytes.items())
    click.echo(f"   KV memory per slot (one per concurrent sequence): {slots}", err=True)
    if gen.backend_name != "cpu":
        models = [("target", gen.target), ("draft", gen.draft)]
        used = ", ".join(f"{role} weights {gen.manifest['models'][role]['weight_bytes'] / 2**20:.0f} MiB + KV and "
                         f"scratch {getattr(backend, 'device_bytes', 0) / 2**20:.0f} MiB" for role, backend in models if backend)
        click.echo(f"   {gen.backend_name} device {getattr(gen.target, 'device_id', 0)} memory: {used}", err=True)


@cli.command()
@click.argument("bundle", type=click.Path())
@click.option("--system", default=None, help="A system message that opens the conversation.")
@click.option("--max-new-tokens", default=512, show_default=True, type=POSITIVE, help="Per reply.")
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(min=0), help="0 = greedy.")
@click.option("--top-k", default=0, show_default=True, type=NON_NEGATIVE, help="0 = off.")
@click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0, 1, min_open=True), help="1 = off.")
@click.option("--seed", default=None, type=SEED, help="Makes sampled replies reproducible.")
@click.option("--policy", default=None,
              help="How many to draft: fixed:K | heuristic | adaptive | adaptive:stop | target [default: adaptive, "
                   "or target for a bundle without a draft].")
@click.option("--drafter", default="model", show_default=True, type=click.Choice(["model", "ngram", "hybrid"]))
@click.option("--stats/--no-stats", default=True, show_default=True,
              help="A line per reply on stderr: tok/s, time to first token, prompt tokens from the cache.")
@threads_option
@backend_option
@gpu_options
def chat(bundle, system, max_new_tokens, temperature, top_k, top_p, seed, policy, drafter, stats, threads, backend,
         device_id, cuda_graphs):
    """Chat with a bundle in the terminal (its chat template; each turn prefills only what is new)."""
    from specedge.chat_repl import run_chat
    from specedge.runtime import load

    gen = load(bundle, backend=backend, threads=threads, device_id=device_id, cuda_graphs=cuda_graphs)
    if gen.backend_choice:
        click.echo(gen.backend_choice, err=True)
    if policy is None:
        policy = "adaptive" if gen.draft is not None or drafter == "ngram" else "target"
    options = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                   policy=policy, drafter=drafter)
    gen.options(**options)                            # a bad option is an error before the first line is read
    gen.encode_messages([{"role": "user", "content": "hi"}])    # and so is a bundle without a chat template
    if system:                                        # and a system prompt that leaves no room for any turn
        size = len(gen.encode_messages([{"role": "system", "content": system}, {"role": "user", "content": "hi"}]))
        if size >= gen.max_seq_len:
            raise OptionError(f"--system: with a one-word message the prompt has {size} tokens, and the bundle's "
                              f"max_seq_len {gen.max_seq_len} leaves no room to reply")
    run_chat(gen, system, options, show_stats=stats)


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
@click.option("--interleave", default="wave", show_default=True, type=click.Choice(["wave", "cell"]),
              help="With --batch: run the configurations wave by wave, side by side (wave), or all of one "
                   "configuration's waves at a size before the next's (cell).")
@click.option("--out", default="bench-out", show_default=True, type=click.Path(file_okay=False))
@threads_option
@backend_option
@gpu_options
@target_rows_option
def bench(bundle, prompts_file, policies, batches, max_new_tokens, temperature, seed, repeat, interleave, out, threads,
          backend, device_id, cuda_graphs, target_rows):
    """Run every policy on the same prompts, side by side, and report acceptance, speed and time split."""
    from specedge.bench import load_prompts, parse_batches, run_bench, run_batch_bench
    from specedge.bench.batch import workload_size
    from specedge.bench.report import batch_plots, batch_table, plots, table
    from specedge.bench.runner import DEFAULT_POLICIES, check_prompts_fit, prepare_out, without_chat, write_results
    from specedge.runtime import load

    sizes = parse_batches(batches)
    names = [p.strip() for p in (policies or DEFAULT_POLICIES).split(",") if p.strip()]
    if not names:
        raise OptionError("--policies names no policy")
    prompts = load_prompts(prompts_file)
    out = prepare_out(Path(out))
    gen = load(bundle, backend=backend, threads=threads, target_rows=_rows(target_rows), max_batch=max(sizes),
               device_id=device_id, cuda_graphs=cuda_graphs)
    if gen.backend_choice:
        click.echo(gen.backend_choice, err=True)
    prompts, note = without_chat(prompts, bool(gen.chat_template), prompts_file is not None)
    if note:
        click.echo(note, err=True)
    if gen.draft is None:
        drafting = [n for n in names if n.split("@")[0] != "target" and not n.endswith("@ngram")]
        if policies and drafting:                 # asked for by name: an error, as the server's 400 (not dropped)
            raise OptionError(f"this bundle has no draft model, which {', '.join(drafting)} need: bench target, or "
                              "POLICY@ngram (prompt lookup)")
        names = [n for n in names if n not in drafting]
    if not policies:                          # the default list's fixed:K the bundle was not exported for
        names = [n for n in names if _runs_here(n, gen.max_draft)]

    def progress(done, total, label):
        width = 30
        bar = "#" * (width * done // total) + "." * (width - width * done // total)
        click.echo(f"\r[{bar}] {done}/{total} {label:<60}", err=True, nl=done == total)

    short = check_prompts_fit(gen, prompts if sizes == [1] else prompts[:workload_size(sizes)],   # the ones that
                              max_new_tokens)                                                       # run
    if short:
        click.echo(f"warning: {short}", err=True)
    if sizes == [1]:
        results = run_bench(gen, prompts, names, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                            repeat=repeat, progress=progress)
        text, draw = table(results), plots
    else:
        results = run_batch_bench(gen, prompts, names, sizes, max_new_tokens=max_new_tokens, temperature=temperature,
                                  seed=seed, repeat=repeat, progress=progress, interleave=interleave)
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
@device_id_option
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
def inspect(bundle, verify, backend, device_id, as_json):
    """Describe a bundle: models, shapes, vocabulary, memory per slot, export checks."""
    from specedge.runtime.manifest import read_manifest

    asked = click.get_current_context().get_parameter_source
    given = [f"--{name.replace('_', '-')}" for name in ("backend", "device_id")
             if asked(name) != click.core.ParameterSource.DEFAULT]
    if given and not verify:
        raise OptionError(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} with --verify (the row check "
                          "runs on that backend); without it inspect reads the manifest only")
    manifest = read_manifest(bundle, verify_hashes=verify)
    rows_equal = min_rows = not_here = None
    if verify:
        from specedge.runtime.row_check import bundle_rows_bitwise_equal
        try:
            if backend == "auto":
                from specedge.runtime.backends import choose_backend
                backend, why = choose_backend(manifest)
                click.echo(why, err=True)
            rows_equal, min_rows = bundle_rows_bitwise_equal(Path(bundle), manifest, backend=backend,
                                                             device_id=device_id)
        except OptionError as err:          # no backend here runs it (bf16 on a CPU): the checksums still stand
            not_here = str(err)
    if as_json:
        here = {"verify_rows_bitwise_equal_here": rows_equal, "target_min_rows_here": min_rows, "backend": backend,
                **({"rows_not_checked": not_here} if not_here else {})}
        click.echo(json.dumps({**manifest, **here} if verify else manifest, indent=2))
        return
    click.echo(describe(manifest, verified=verify))
    if not_here:
        click.echo(f"  target verify rows: not checked on this machine ({_one_line(not_here)})")
    elif verify:
        click.echo(f"  target verify rows bitwise equal to single steps on this machine ({backend}): " +
                   (f"yes (a lone token as {min_rows} row{'s' if min_rows > 1 else ''})" if rows_equal else
                    "NO (greedy speculative output may differ from target-only output at near-ties)"))


@cli.command()
@click.argument("bundle", type=click.Path())
@click.option("--tensorrt", is_flag=True,
              help="Build TensorRT engines (experimental: not yet run on a GPU; needs TensorRT >= 10.15, cuda-python "
                   "and a bundle exported with --attention standard, unquantized).")
@click.option("--profiles", default=None,
              help="Optimization profiles: comma-separated presets (decode, prefill; default: both) or "
                   "NAME:TMIN-TMAX[@TOPT] tokens per row. They must cover every call the runtime makes.")
@click.option("--max-batch", default=1, show_default=True, type=POSITIVE,
              help="Concurrent sequences the engines take (load(..., max_batch=N) up to this).")
@click.option("--hardware-compatibility", default="none", show_default=True,
              type=click.Choice(["none", "same-compute-capability", "ampere-plus"]),
              help="Which other GPUs may load the engines (none: this GPU model only; fastest).")
@click.option("--workspace-gib", default=None, type=click.FloatRange(min=0, min_open=True),
              help="TensorRT's builder workspace limit (default: TensorRT's).")
@device_id_option
def build(bundle, tensorrt, profiles, max_batch, hardware_compatibility, workspace_gib, device_id):
    """Compile a bundle's step graphs into engines for this GPU, written into the bundle (experimental)."""
    if not tensorrt:
        raise OptionError("say which engines to build: --tensorrt (the only kind so far)")
    from specedge.engines.tensorrt_build import build_tensorrt_engines

    record = build_tensorrt_engines(bundle, profiles=profiles, max_batch=max_batch, device_id=device_id,
                                    hardware_compatibility=hardware_compatibility, workspace_gib=workspace_gib,
                                    progress=lambda line: click.echo(line, err=True))
    click.echo(f"TensorRT {record['tensorrt_version']} engines for {record['gpu']['name']} in {bundle} "
               f"(experimental; run with --backend tensorrt)")


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
            f"{spec['num_kv_heads']} kv, head_dim {spec['head_dim']}{_rope_words(spec)}",
            f"    weights {model.get('weights', 'float32')}{_blocks(model)} {_size(model['weight_bytes'])} "
            f"({_embedding_line(model)}), KV {_size(kv_bytes)} per slot",
            f"    export check: max logit error {check.get('max_abs_logit_error', float('nan')):.2e} "
            f"(tolerance {check.get('tolerance', float('nan')):.2e}), top-1 agreement "
            f"{check.get('top1_agreement', float('nan')):.3f}, verify rows bitwise equal: "
            f"{ {True: 'yes', False: 'NO'}.get(check.get('verify_rows_bitwise_equal'), '?') }"
            + (" (a float32 copy of the graph)" if check.get("checked_as") else ""),
        ]
        half = check.get("float16_on_cpu")
        if half:
            lines.append(f"    the float16 graph on the CPU provider: max logit error "
                         f"{half['max_abs_logit_error']:.2e} (tolerance {half['tolerance']:.2e})")
        q = check.get("vs_source", check.get("vs_unquantized"))       # vs_unquantized: older bundles
        if q:
            lines.append(f"    vs source model: top-1 agreement {q['top1_agreement']:.3f} over {q['positions']} "
                         f"prompt positions, max logit error {q['max_abs_logit_error']:.3g}")
    total = memory_report(m)["total_bytes"]
    lines.append(f"  memory: weights + KV of one slot {total / 2**30:.2f} GiB at max_seq_len {m['max_seq_len']} "
                 "(each further concurrent sequence, --max-batch, adds one slot per model)")
    lines.append(f"  files: {len(m['files'])}" + (", all checksums verified" if verified else ""))
    return "\n".join(lines)


def _rope_words(spec: dict) -> str:
    """", rope longrope (long factors), 96 of 128 dims turned" and the like; "" for learned positions."""
    rope = spec.get("rope") or {}
    if not rope:
        return ""
    words = f", rope {rope.get('type', 'default')}" + (" (long factors)" if rope.get("long") else "")
    turned = spec.get("rotary_dim") or spec["head_dim"]
    return words + (f", {turned} of {spec['head_dim']} dims turned" if turned < spec["head_dim"] else "")


def _embedding_line(model: dict) -> str:
    stored = "quantized" if model.get("quantization", {}).get("embedding") else model["kv"].get("dtype", "float32")
    size = model.get("embedding_bytes")
    return f"embedding {stored}" + (f" {_size(size)}" if size else "")


def _blocks(model: dict) -> str:
    block = model.get("quantization", {}).get("block_size")
    return f" (blocks of {block})" if block else ""


def _size(n: int) -> str:
    """Bytes as MiB, or KiB below a tenth of one (a tiny model's KV slot is not '0.0 MiB')."""
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 / 10 else f"{n / 2**10:.1f} KiB"


def main(argv=None) -> int:
    interrupt = InterruptWatch()
    for stream in (sys.stdout, sys.stderr):
        if not _utf8(stream) and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")   # a cp1252 console or file: what it cannot show prints as '?'
    try:
        cli.main(args=argv, prog_name="specedge", standalone_mode=False)
    except BaseException as err:  # noqa: BLE001 - each kind gets its line and exit code; the rest is re-raised
        return _report(err, interrupt.seen)
    finally:
        interrupt.restore()
    return 0


def _utf8(stream) -> bool:
    return (getattr(stream, "encoding", None) or "").lower().replace("-", "").replace("_", "") == "utf8"


def _report(err: BaseException, interrupted: bool) -> int:
    """One line on stderr and the exit code for an error that ended a command."""
    if interrupted or isinstance(err, (KeyboardInterrupt, click.exceptions.Abort)):
        # Ctrl+C can land inside a library's import or cleanup and surface as another exception: still Ctrl+C
        click.echo("specedge: interrupted", err=True)
        return EXIT_INTERRUPTED
    if isinstance(err, click.ClickException):
        click.echo(f"specedge: error: {_one_line(err.format_message())}", err=True)
        return EXIT_USAGE
    if isinstance(err, OptionError):
        text = err.worded("--policy target", "--drafter ngram") if isinstance(err, NoDraftModel) else str(err)
        click.echo(f"specedge: error: {_one_line(text)}", err=True)
        return EXIT_USAGE
    if isinstance(err, SpecedgeError):
        click.echo(f"specedge: error: {_one_line(str(err))}", err=True)
        return EXIT_FAILURE
    raise err


def _runs_here(name: str, max_draft: int) -> bool:
    from specedge.runtime.policies import make_policy

    try:
        make_policy(name.split("@")[0], max_draft)      # refuses a fixed:K beyond max_draft
    except OptionError:
        return False
    return True


def _one_line(text: str) -> str:
    return " ".join(text.split())



# -- serve (issue 16): an OpenAI-compatible server, and load on it --------------------------------------------------
def _serve_extra(err: ImportError) -> SpecedgeError:
    return SpecedgeError(f"serving needs the 'serve' extra (missing {err.name}): pip install 'specedge[serve]'")


@cli.command()
@click.argument("bundle", type=click.Path())
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (loopback by default; elsewhere, set --api-key).")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option("--max-batch", default=None, type=POSITIVE,
              help="Concurrent sequences (KV slots, allocated at start) [default: 8 for a bundle exported with "
                   "--attention standard, else 1].")
@click.option("--max-queue", default=64, show_default=True, type=NON_NEGATIVE,
              help="Requests that may wait for a slot; beyond them a request gets 429 with Retry-After.")
@click.option("--api-key", default=None, envvar="SPECEDGE_API_KEY",
              help="Require 'Authorization: Bearer KEY' on every route but /health and /metrics (also read from "
                   "SPECEDGE_API_KEY).")
@click.option("--served-model-name", default=None, help="The model id clients send [default: the bundle folder's name].")
@click.option("--policy", default=None,
              help="Default speculation (a request may override it): fixed:K | heuristic | adaptive | adaptive:stop | "
                   "target [default: adaptive, or target for a bundle without a draft].")
@click.option("--drafter", default="model", show_default=True, type=click.Choice(["model", "ngram", "hybrid"]),
              help="Default drafter.")
@click.option("--request-timeout", default=600.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds a request may take, queueing included; then it ends with what it has (finish_reason "
                   "'length', speculation.stop_reason 'timeout'). A request may ask for less ('timeout').")
@click.option("--drain-timeout", default=30.0, show_default=True, type=click.FloatRange(min=0),
              help="On SIGTERM / Ctrl+C: seconds in-flight requests may take to finish before they are cancelled.")
@click.option("--max-body-bytes", default=1 << 20, show_default=True, type=POSITIVE,
              help="Largest request body (413 beyond it).")
@click.option("--prompt-cache/--no-prompt-cache", default=None,
              help="Free KV slots keep their text: a request starting with it (a conversation's next turn, a shared "
                   "system prompt) prefills only the rest (usage.prompt_tokens_details.cached_tokens) [default: on "
                   "where that is exact: the cpu backend].")
@click.option("--stored-responses", default=256, show_default=True, type=NON_NEGATIVE,
              help="Responses (POST /v1/responses) kept in memory for previous_response_id and GET /v1/responses/{id}, "
                   "the newest first; 0 keeps none. Each replica keeps its own.")
@click.option("--reasoning-parser/--no-reasoning-parser", "reasoning", default=True,
              help="A reasoning model's thinking (<think>...</think>, where the chat template has it) comes back as "
                   "message.reasoning_content, apart from content [default: on].")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--ray", "use_ray", is_flag=True,
              help="Deploy on Ray Serve (the 'ray' extra): --replicas engines behind one route (docs/serve.md).")
@click.option("--replicas", default=1, show_default=True, type=POSITIVE,
              help="With --ray: replicas, each with its own batched engine (--max-batch slots).")
@click.option("--autoscale", default=None, metavar="MIN:MAX",
              help="With --ray: let Ray Serve scale between MIN and MAX replicas (instead of --replicas).")
@click.option("--target-ongoing-requests", default=None, type=click.FloatRange(min=0, min_open=True),
              help="With --autoscale: requests in flight per replica that Ray Serve aims at [default: --max-batch].")
@click.option("--replica-cpus", default=None, type=click.FloatRange(min=0, min_open=True),
              help="With --ray: CPUs Ray reserves per replica (placement only) [default: --threads, else 1].")
@click.option("--ray-address", default=None,
              help="With --ray: a running Ray cluster ('auto', or ray://HEAD:10001) [default: RAY_ADDRESS, else a Ray "
                   "started for this run on this machine].")
@threads_option
@backend_option
@gpu_options
@target_rows_option
def serve(bundle, host, port, max_batch, max_queue, api_key, served_model_name, policy, drafter, request_timeout,
          drain_timeout, max_body_bytes, prompt_cache, stored_responses, reasoning, log_level, use_ray, replicas,
          autoscale, target_ongoing_requests, replica_cpus, ray_address, threads, backend, device_id, cuda_graphs,
          target_rows):
    """Serve a bundle over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /v1/responses,
    /metrics)."""
    import logging

    try:
        from specedge.serve.engine import EngineConfig, load_engine
        from specedge.serve.server import listen, serve_forever
    except ImportError as err:
        raise _serve_extra(err) from err

    if api_key == "" or (api_key is None and os.environ.get("SPECEDGE_API_KEY") == ""):   # click drops an empty env
        raise OptionError("--api-key (or SPECEDGE_API_KEY) is empty: give a key, or leave the option and the variable "
                          "out to serve without one")
    if served_model_name is not None and not served_model_name.strip():
        raise OptionError("--served-model-name is empty: give a name, or leave it out to serve the bundle folder's")
    if served_model_name is not None and served_model_name.endswith("/"):
        raise OptionError(f"--served-model-name '{served_model_name}' ends in '/', which the server reads as a "
                          "trailing slash of the path: drop it")
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = EngineConfig(bundle=bundle, max_batch=max_batch, max_queue=max_queue, served_model_name=served_model_name,
                          policy=policy, drafter=drafter, request_timeout=request_timeout, threads=threads,
                          backend=backend, device_id=device_id, cuda_graphs=cuda_graphs, target_rows=_rows(target_rows),
                          prompt_cache=prompt_cache, reasoning=reasoning, stored_responses=stored_responses)
    if use_ray:
        _serve_on_ray(config, host, port, api_key, drain_timeout, max_body_bytes, log_level, replicas, autoscale,
                      target_ongoing_requests, replica_cpus, ray_address)
        return
    ray_only = {"--replicas": replicas != 1, "--autoscale": autoscale, "--ray-address": ray_address,
                "--target-ongoing-requests": target_ongoing_requests, "--replica-cpus": replica_cpus}
    given = [name for name, value in ray_only.items() if value]
    if given:
        raise OptionError(f"{', '.join(given)} only appl{'ies' if len(given) == 1 else 'y'} with --ray")
    sock = listen(host, port)                     # before loading: a port in use fails at once
    try:
        gen, limits = load_engine(config)
    except BaseException:
        sock.close()
        raise
    if gen.backend_choice:
        click.echo(gen.backend_choice, err=True)
    serve_forever(gen, limits, sock, api_key=api_key, drain_timeout=drain_timeout, max_body_bytes=max_body_bytes)


def _serve_on_ray(config, host, port, api_key, drain_timeout, max_body_bytes, log_level, replicas, autoscale,
                  target_ongoing_requests, replica_cpus, ray_address) -> None:
    bounds = None
    if autoscale is not None and replicas != 1:
        raise OptionError("give --replicas N (fixed) or --autoscale MIN:MAX, not both")
    if autoscale is not None:
        low, sep, high = autoscale.partition(":")
        if not (sep and low.isdigit() and high.isdigit() and int(high) >= max(int(low), 1)):
            raise OptionError(f"--autoscale takes MIN:MAX replicas, 0 <= MIN <= MAX, MAX >= 1; got '{autoscale}'")
        bounds = (int(low), int(high))
    elif target_ongoing_requests is not None:
        raise OptionError("--target-ongoing-requests only applies with --autoscale")
    try:
        from specedge.serve import ray_app
    except ImportError as err:
        raise SpecedgeError(f"--ray needs the 'ray' extra (missing {err.name}): pip install 'specedge[ray]'") from err
    from specedge.serve.server import is_loopback

    if not is_loopback(host) and not api_key:
        click.echo(f"specedge: warning: Ray Serve listens on {host} without --api-key: anyone who can reach this "
                   "port can use the server", err=True)
    app = ray_app.application(config, replicas, bounds, target_ongoing_requests, api_key, max_body_bytes,
                              drain_timeout, log_level, replica_cpus)
    ray_app.run(app, address=ray_address, host=host, port=port)


@cli.command("bench-serve")
@click.argument("bundle", required=False, type=click.Path())
@click.option("--url", default=None,
              help="A running server's base URL, e.g. http://127.0.0.1:8000/v1 (without it, BUNDLE is served on a "
                   "free loopback port for the run, in a separate process).")
@click.option("--api-key", default=None, envvar="SPECEDGE_API_KEY")
@click.option("--model", default=None, help="Model id [default: the server's first /v1/models entry].")
@click.option("--concurrency", default="1,2,4,8,16", show_default=True, help="Comma-separated concurrency levels.")
@click.option("--policies", default="target,fixed:4,adaptive", show_default=True,
              help="Comma-separated POLICY[@DRAFTER], sent as extra_body speculation ('target' = off).")
@click.option("--requests", "requests_per_level", default=None, type=POSITIVE,
              help="Requests per (concurrency, policy) [default: 2 x concurrency, at least 4].")
@click.option("--prompts", "prompts_file", default=None, type=click.Path(dir_okay=False),
              help="JSONL, one {\"prompt\": ..., \"chat\": false} per line (default: bench's built-in set).")
@click.option("--max-tokens", default=64, show_default=True, type=POSITIVE)
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(0, 2))
@click.option("--ignore-eos/--no-ignore-eos", default=True, show_default=True,
              help="Every request generates --max-tokens tokens.")
@click.option("--max-batch", default=None, type=POSITIVE,
              help="When serving BUNDLE: KV slots [default: the largest concurrency].")
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(min=1),
              help="Runs of every (concurrency, policy) cell, interleaved; medians are reported.")
@click.option("--out", default="bench-serve-out", show_default=True, type=click.Path(file_okay=False))
@threads_option
def bench_serve(bundle, url, api_key, model, concurrency, policies, requests_per_level, prompts_file, max_tokens,
                temperature, ignore_eos, max_batch, repeat, out, threads):
    """Load a server with the openai client at several concurrency levels, per speculation policy."""
    try:
        import openai  # noqa: F401
        from specedge.bench.serve import plots, run_bench_serve, served, table
    except ImportError as err:
        raise _serve_extra(err) from err
    from specedge.bench.batch import parse_batches
    from specedge.bench.runner import load_prompts, without_chat, write_results
    from specedge.runtime.manifest import read_manifest

    if (bundle is None) == (url is None):
        raise OptionError("give either a BUNDLE to serve or --url of a running server")
    levels = parse_batches(concurrency, "--concurrency")
    names = [p.strip() for p in policies.split(",") if p.strip()]
    if not names:
        raise OptionError("--policies is empty")
    prompts = load_prompts(prompts_file)
    if bundle is not None:                  # a running server's template is not known here: its 400 will say
        template = read_manifest(bundle)["tokenizer"].get("chat_template")
        prompts, note = without_chat(prompts, bool(template), prompts_file is not None)
        if note:
            click.echo(note, err=True)

    def progress(done, total, label):
        click.echo(f"[{done}/{total}] {label}", err=True)

    def run(base, pid):
        return run_bench_serve(base, prompts, names, levels, requests_per_level, max_tokens=max_tokens,
                               temperature=temperature, ignore_eos=ignore_eos, api_key=api_key, model=model,
                               server_pid=pid, progress=progress, repeat=repeat)

    if url is None:
        click.echo(f"starting a server on {bundle} ...", err=True)
        extra = ("--api-key", api_key) if api_key else ()
        with served(bundle, max_batch or max(levels), threads, extra) as (base, pid):
            results = run(base, pid)
        results["bundle"] = str(bundle)
    else:
        results = run(url.rstrip("/"), None)
    out = Path(out)
    path = write_results(results, out)
    click.echo(table(results))
    written = plots(results, out)
    if written is None:
        click.echo("plots skipped: matplotlib is not installed (pip install 'specedge[plots]')", err=True)
    click.echo(f"wrote {path}" + (f" and {len(written)} plots" if written else ""), err=True)
    failed = [(policy, level, cell) for policy, cells in results["runs"].items() for level, cell in cells.items()
              if cell["requests"] == 0]
    if failed:                                    # a cell of errors only has no figures: the run did not measure
        policy, level, cell = failed[0]
        raise SpecedgeError(f"{len(failed)} cell(s) had no successful request, first {policy} at concurrency "
                            f"{level}: {(cell['error_samples'] or ['?'])[0]}")

if __name__ == "__main__":
    sys.exit(main())
