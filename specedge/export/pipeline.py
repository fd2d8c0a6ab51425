"""export_bundle: sources -> checked step graphs + tokenizer + manifest, moved into place at the end."""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

from specedge import __version__
from specedge.errors import ExportError, ExportOptionError
from specedge.export.check import (check_graph, dequantized_overrides, prompt_agreement, random_ids,
                                   reference_logits, source_logits)
from specedge.export.dtype_audit import audit_dtype
from specedge.export.onnx_builder import FLOAT_TYPES, GraphBuilder
from specedge.export.quantize import Quantization, check_block_size, fitting_block_size, parse_quantization
from specedge.export.reference_model import long_rope_everywhere, skeleton
from specedge.export.source_weights import SourceWeights, open_weights
from specedge.export.sources import Source, open_source
from specedge.export.step_graph import ATTENTION_VARIANTS, StepGraph
from specedge.export.tokenizer_files import write_tokenizer
from specedge.limits import MAX_DRAFT_LIMIT, MIN_SEQ_LEN
from specedge.models import architecture_of
from specedge.models.spec import rope_inv_freq
from specedge.models.weights import WeightTable
from specedge.runtime.manifest import FORMAT, FORMAT_VERSION, MANIFEST, file_record, read_manifest

DEFAULT_ATTENTION = "gqa"                # "standard" runs batches; which is faster is measured per machine
DTYPE_ALIASES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
CHECK_DIR = ".float32-check"             # a half-precision bundle's float32 copies, checked, then removed


class Progress:
    """Stage lines with elapsed seconds; `progress=None` keeps export quiet."""

    def __init__(self, echo):
        self.echo, self.start = echo, time.perf_counter()

    def __call__(self, message: str) -> None:
        if self.echo:
            self.echo(f"[{time.perf_counter() - self.start:7.1f}s] {message}")


def default_tolerance(max_abs_logit: float, quantization: Quantization | None = None, draft: bool = False) -> float:
    """fp32 graphs agree with transformers to rounding; allow for reduction order over many layers.

    At accuracy level 4 MatMulNBits also rounds the activations to int8 per block, which the
    dequantized-weight reference does not: measured 2% (int4 0.5B) to 11% (int4 1.5B, 28 layers) of the
    largest logit; a wrong graph is off by the whole logit range. A draft's numbers change only its acceptance, and
    its blocks default to 128, where activations round more coarsely: it is allowed sqrt(block / 32) times that
    (the 1.5B model at block 128: 5.60 against 3.77 at block 32's allowance).
    """
    if quantization is not None and quantization.accuracy_level == 4:
        return (1e-2 + 0.2 * max_abs_logit) * (math.sqrt(quantization.block_size / 32) if draft else 1.0)
    return 1e-3 + 1e-4 * max_abs_logit


def export_bundle(target: str, draft: str | None, out: str | Path, max_seq_len: int = 2048, max_draft: int = 8,
                  tolerance: float | None = None, force: bool = False, progress=print,
                  quantize: str | None = None, draft_quantize: str | None = None, block_size: int | None = None,
                  draft_block_size: int | None = None, accuracy_level: int = 4, rounding: str = "minmax",
                  attention: str | None = None, quantize_embeddings: bool | None = None, dtype: str = "float32",
                  check: bool = True) -> Path:
    """quantize: "none" | "int4" | "int8" for the target, and the draft unless draft_quantize says otherwise;
    block_size: the target's quantization block (None: 32), and the draft's unless draft_block_size says otherwise;
    draft_block_size: None with block_size None: the coarsest of 128, 64, 32 dividing the draft's matrices (its
    rounding changes only its speed and acceptance: quantize.DRAFT_BLOCK_SIZES);
    rounding: "minmax" (the default) | "lsq" (weighted least squares): how quantized blocks pick scale and zero
    point (quantize.py);
    attention: "gqa" (GroupQueryAttention, one row a call) | "standard" (standard ops, any batch; see
    step_graph.py); None: gqa, or standard for bfloat16 (which only the cuda backend runs, on standard graphs);
    quantize_embeddings: the embedding tables of quantized models too (see StepGraph.embedding); None: on
    whenever a model is quantized (a decode step gathers one row either way, and the table shrinks ~7x at
    int4), False: fp32 tables;
    dtype: "float32" | "float16" | "bfloat16" (also "fp32", "fp16", "bf16"): weights, activations and KV buffers
    of both graphs; norms and softmax run in float32 and logits come out in float32 either way. Checked against
    transformers through a float32 copy of the same graph, plus an audit of the half-precision graph
    (dtype_audit.py), and a float16 graph also on onnxruntime's CPU provider (which has no bfloat16 MatMul);
    check: False writes the graphs unchecked (timing bundles of random weights, scripts/gpu_check.py only)."""
    out = Path(out).expanduser().absolute()
    dtype = DTYPE_ALIASES.get(dtype, dtype)
    if dtype not in FLOAT_TYPES:
        raise ExportOptionError(f"--dtype must be one of fp32, fp16, bf16, got '{dtype}'")
    chosen = attention is None
    if chosen:
        attention = "standard" if dtype == "bfloat16" else DEFAULT_ATTENTION
    if attention not in ATTENTION_VARIANTS:
        raise ExportOptionError(f"--attention must be one of {', '.join(ATTENTION_VARIANTS)}, got '{attention}'")
    if dtype == "bfloat16" and attention == "gqa":
        raise ExportOptionError("a bf16 bundle runs on the cuda backend only (onnxruntime's CPU provider has no "
                                "bfloat16 MatMul), which runs --attention standard graphs: drop --attention gqa")
    say = Progress(progress)
    if out.parent.is_dir():                       # first: a killed export may have moved an old bundle aside
        _remove_stale_work(out, say)
    _validate(out, max_seq_len, max_draft, force)
    if draft is None and draft_quantize not in (None, "none"):
        raise ExportOptionError(f"--draft-quantize needs a draft model (--draft none): drop it, or use --quantize "
                                f"{draft_quantize} for the target")
    fit_draft_block = draft_block_size is None and block_size is None
    if draft_block_size is not None:
        check_block_size(draft_block_size, "--draft-block-size")
    quantizations = {"target": parse_quantization(quantize, block_size or 32, accuracy_level, rounding),
                     "draft": parse_quantization(draft_quantize or quantize, draft_block_size or block_size or 32,
                                                 accuracy_level, rounding)}
    if draft_block_size is not None and (draft is None or quantizations["draft"] is None):
        raise ExportOptionError("--draft-block-size applies to a quantized draft: " + (
            "there is none (--draft none)" if draft is None else "the draft is not quantized (--draft-quantize none)"
            if draft_quantize == "none" else "add --draft-quantize (or --quantize) int4 / int8"))
    if dtype == "bfloat16" and any(quantizations.values()):
        raise ExportOptionError("--dtype bf16 cannot be combined with --quantize/--draft-quantize (MatMulNBits runs "
                                "float32 or float16 activations); use --dtype fp16 for quantized half-precision "
                                "bundles")
    if not any(quantizations.values()) and (block_size or 32, accuracy_level, rounding) != (32, 4, "minmax"):
        raise ExportOptionError("--block-size, --accuracy-level and --rounding apply to quantized models: add "
                                "--quantize or --draft-quantize int4 / int8")
    if tolerance is not None and not math.isfinite(tolerance):      # nan fails every check, inf passes any
        raise ExportOptionError(f"--tolerance must be a finite number, got {tolerance}")
    if quantize_embeddings is None:
        quantize_embeddings = any(quantizations.values())
    if quantize_embeddings and not any(quantizations.values()):
        raise ExportOptionError("--quantize-embeddings needs --quantize or --draft-quantize (int4 or int8)")
    if chosen and attention != DEFAULT_ATTENTION:
        say(f"attention: {attention} (a bf16 bundle runs on the cuda backend, which runs standard graphs)")
    made = [folder for folder in (out.parent, *out.parent.parents) if not folder.exists()]   # removed on failure
    try:                                          # the bundle is written beside --out, then moved into place
        out.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f"{_work_prefix(out)}{_owner()}-", dir=out.parent))
    except (FileExistsError, NotADirectoryError):        # a file where a folder of the path would be
        raise ExportError(f"cannot write a bundle at {out}: a file stands where one of its folders would be") \
            from None
    except OSError as err:
        raise ExportError(f"cannot write a bundle at {out}: {err.strerror or err}") from None
    try:
        say(f"reading target {target}")
        sources = {"target": open_source(target)}
        if draft is not None:
            say(f"reading draft {draft}")
            sources["draft"] = open_source(draft)
        vocab_size = _shared_vocab(sources, say)
        tokenizer_info = write_tokenizer(sources["target"].tokenizer, work, say)
        prompts = _check_prompts(sources["target"].tokenizer, vocab_size)
        models, eos_ids = {}, []
        for role, source in sources.items():
            models[role], ids = _export_model(role, source, work, vocab_size, max_seq_len, max_draft, tolerance,
                                              say, quantizations[role], prompts, attention, quantize_embeddings,
                                              dtype, check, fit_block=role == "draft" and fit_draft_block)
            ids = [i for i in ids if i < vocab_size]
            if role == "target":
                eos_ids = list(dict.fromkeys(ids))
            elif set(ids) - set(eos_ids):
                # the output is the target's, ending where the target's would: a draft's own eos ids do not end it
                say(f"draft: its end ids {sorted(set(ids) - set(eos_ids))} are not the target's; generation ends "
                    "at the target's")
        if not eos_ids:
            raise ExportError("the target names no end-of-sequence token")
        manifest = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "specedge_version": __version__,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "vocab_size": vocab_size, "eos_token_ids": eos_ids, "max_seq_len": max_seq_len,
            "max_draft": max_draft, "dtype": dtype, "tokenizer": tokenizer_info, "models": models,
            "engines": {},
        }
        say("hashing files")
        shutil.rmtree(work / CHECK_DIR, ignore_errors=True)
        manifest["files"] = {p.name: file_record(p) for p in sorted(work.iterdir()) if p.is_file()}
        (work / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        read_manifest(work)                                  # what the runtime will check, checked here first
        work.chmod(0o755)
        _move_into_place(work, out, force)
    except BaseException as err:
        shutil.rmtree(work, ignore_errors=True)
        for folder in made:                               # deepest first; only the empty folders this export made
            try:
                folder.rmdir()
            except OSError:
                break
        if isinstance(err, OSError):                         # a full disk, a file too large: said in one line
            where = f" ({err.filename})" if err.filename else ""
            raise ExportError(f"export stopped: {err.strerror or err}{where}; nothing was written") from err
        raise
    say(f"wrote {out}")
    return out


def _work_prefix(out: Path) -> str:
    return f".{out.name}.export-"                 # then _owner(): .OUT.export-HOST-PID-xxxx


def _host() -> str:
    return "".join(c if c.isalnum() else "_" for c in socket.gethostname()) or "host"


def _owner() -> str:
    """This export's machine and process: a work folder is another's to remove only where its process is gone,
    which only the same machine can tell (a volume may be shared with other hosts or containers)."""
    return f"{_host()}-{os.getpid()}"


def _remove_stale_work(out: Path, say) -> None:
    """Work folders of exports to the same --out made on this machine by a process that is gone (SIGKILL or the
    out-of-memory killer leave them, possibly gigabytes): removed; an old bundle such an export had moved aside
    to replace it (-replaced) is put back where --out is free. A running export's, or another host's, are left."""
    prefix, host = _work_prefix(out), _host()
    try:
        folders = list(out.parent.iterdir())
    except OSError:                               # unreadable: the export's own writing will say what is wrong
        return
    for folder in folders:
        rest = folder.name[len(prefix):] if folder.name.startswith(prefix) else ""
        pid = rest[len(host) + 1:].split("-")[0] if rest.startswith(f"{host}-") else ""
        if not pid.isdigit() or _alive(int(pid)):
            continue
        if folder.name.endswith("-replaced") and not out.exists() and (folder / MANIFEST).exists():
            try:
                folder.rename(out)
            except OSError:
                continue
            say(f"put back {out.name}, which an export killed while replacing it had moved aside")
        else:
            shutil.rmtree(folder, ignore_errors=True)
            say(f"removed {folder.name}, left by an export that was killed")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:                               # another user's process: alive
        return True
    return True


def _move_into_place(work: Path, out: Path, force: bool) -> None:
    """work -> out. An existing bundle (--force) is moved aside first, checked to be the bundle (not something
    that took its place meanwhile), and removed only once the new one is in place: a failure here leaves it."""
    _check_out(out, force)                                   # again: --out may have changed during the export
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()                                          # an empty folder is taken (rename needs it gone)
    if not out.exists():
        work.rename(out)
        return
    owner = f"{_work_prefix(out)}{_owner()}"
    aside = out.with_name(f"{owner}-replaced")
    out.rename(aside)
    if not (aside / MANIFEST).exists():                      # replaced in the instant between: not ours to remove
        aside.rename(out)
        raise ExportError(f"{out} changed while the export finished; nothing was replaced")
    try:
        work.rename(out)
    except BaseException:
        aside.rename(out)
        raise
    discard = aside.rename(out.with_name(f"{owner}-discard"))  # never taken for an old bundle to put back
    shutil.rmtree(discard, ignore_errors=True)


def _validate(out: Path, max_seq_len: int, max_draft: int, force: bool) -> None:
    _check_out(out, force)
    if max_seq_len < MIN_SEQ_LEN:
        raise ExportOptionError(f"--max-seq-len must be at least {MIN_SEQ_LEN}, got {max_seq_len}")
    if not 1 <= max_draft <= MAX_DRAFT_LIMIT:
        raise ExportOptionError(f"--max-draft must be between 1 and {MAX_DRAFT_LIMIT}, got {max_draft}")


def _check_out(out: Path, force: bool) -> None:
    """--out may be new, an empty folder, or (with force) a bundle; anything else is the user's and stays."""
    if out.is_symlink():
        raise ExportError(f"{out} is a symbolic link (to {os.readlink(out)}): give the folder itself as --out")
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} exists and is not a folder")
    empty = out.is_dir() and not any(out.iterdir())
    # only a bundle is ever replaced (--force): a folder of anything else is the user's, and is never offered
    if out.exists() and not empty and not (out / MANIFEST).exists():
        raise ExportError(f"{out} exists and is not a bundle; choose another --out (export never replaces it)")
    if out.exists() and not empty and not force:
        raise ExportError(f"{out} already holds a bundle (pass --force to replace it)")


def _shared_vocab(sources: dict[str, Source], say) -> int:
    """Bundle vocabulary: the rows every model has; padded rows beyond it are sliced off, said aloud."""
    rows = {role: s.config["vocab_size"] for role, s in sources.items()}
    tokenizers = {role: s.tokenizer for role, s in sources.items()}
    if "draft" in tokenizers and tokenizers["draft"].get_vocab() != tokenizers["target"].get_vocab():
        vt, vd = tokenizers["target"].get_vocab(), tokenizers["draft"].get_vocab()
        differ = sum(1 for tok, i in vt.items() if vd.get(tok) != i) + len(set(vd) - set(vt))
        raise ExportError(f"draft and target vocabularies differ ({differ} token{'s' if differ != 1 else ''} missing "
                          "or mapped to different ids); "
                          "speculative decoding needs one shared tokenizer")
    vocab_size = min(rows.values())
    needed = len(tokenizers["target"])
    if needed > vocab_size:
        raise ExportError(f"the tokenizer has {needed} tokens but a model has only {vocab_size} embedding rows")
    for role, n in rows.items():
        if n > vocab_size:
            say(f"{role}: slicing embedding/LM-head rows {n} -> {vocab_size} (padding beyond the shared vocabulary)")
    return vocab_size


def _check_prompts(tokenizer, vocab_size: int) -> list[list[int]]:
    from specedge.prompts import BUILTIN_PROMPTS

    encoded = [tokenizer.encode(row["prompt"]) for row in BUILTIN_PROMPTS]
    return [ids for ids in ([i for i in e if i < vocab_size] for e in encoded) if len(ids) >= 2]


def _write_graph(path: Path, role: str, spec, family, source_weights: SourceWeights, max_seq_len: int,
                 max_draft: int, quantization: Quantization | None, attention: str, quantize_embedding: bool,
                 dtype: str) -> tuple[StepGraph, GraphBuilder]:
    weights = WeightTable(source_weights.names, source_weights.array,
                          ignore=("rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias"))
    builder = GraphBuilder(path, f"specedge_{role}", float_dtype=dtype)
    graph = StepGraph(builder, spec, max_seq_len, max_draft, quantization, attention, quantize_embedding)
    family.build(graph, spec, weights)
    weights.finish()
    builder.save()
    return graph, builder


def half_tolerance(max_abs_logit: float, quantization: Quantization | None) -> float:
    """float16 activations carry ~3 significant digits through every layer: allow 5% of the largest logit
    (on top of what quantization allows); a wrong graph is off by the whole logit range."""
    return default_tolerance(max_abs_logit, quantization) + 0.05 * max_abs_logit


def _half_check(path: Path, entry: dict, reference, ids, vocab_size: int, max_seq_len: int, quantization,
                role: str, say) -> dict:
    """The float16 graph itself on onnxruntime's CPU provider against the same reference, with its tolerance."""
    check = check_graph(path, entry, reference, ids, vocab_size, max_seq_len, "", role)
    limit = half_tolerance(check["max_abs_logit"], quantization)
    say(f"{role}: float16 graph on the CPU provider: max logit error {check['max_abs_logit_error']:.2e} (tolerance "
        f"{limit:.2e}), top-1 agreement {check['top1_agreement']:.3f}, verify rows bitwise equal to single steps: "
        f"{'yes' if check['verify_rows_bitwise_equal'] else 'NO'}")
    if not check["max_abs_logit_error"] <= limit or not check["ids_equal_argmax"]:
        raise ExportError(f"{role}: the float16 graph differs from transformers by {check['max_abs_logit_error']:.3g} "
                          f"(tolerance {limit:.3g}); nothing was written")
    keep = ("max_abs_logit_error", "top1_agreement", "verify_rows_bitwise_equal", "batch_rows_bitwise_equal",
            "min_rows")
    return {**{k: check[k] for k in keep if k in check}, "tolerance": limit}


def _export_model(role: str, source: Source, work: Path, vocab_size: int, max_seq_len: int, max_draft: int,
                  tolerance: float | None, say, quantization: Quantization | None,
                  prompts: list[list[int]], attention: str, quantize_embedding: bool = False, dtype: str = "float32",
                  run_checks: bool = True, fit_block: bool = False) -> tuple[dict, list[int]]:
    """fit_block: the quantization's block becomes the coarsest that fits this model's matrices (a draft's)."""
    cfg = source.config
    architecture, family = architecture_of(cfg)
    if dtype == "float16" and architecture.startswith("Gemma"):
        # Gemma's activations exceed float16's range (transformers advises bfloat16): inf or NaN on real text, which
        # the export check's few random tokens may not reach
        raise ExportError(f"{role}: {architecture} overflows float16; export with --dtype bf16 (or fp32, or int4)")
    spec = family.spec_from_config(cfg, architecture)
    spec.vocab_size = vocab_size
    if spec.family == "gpt2" and max_seq_len > spec.max_position_embeddings:
        raise ExportError(f"{role}: max_seq_len {max_seq_len} exceeds its {spec.max_position_embeddings} positions")
    if spec.rope.get("type") == "dynamic":
        # dynamic NTK scaling changes the frequencies only past the original length: within it, it is the default
        original = cfg.get("max_position_embeddings")
        if not isinstance(original, int) or max_seq_len > original:
            raise ExportError(f"{role}: dynamic rope scaling beyond its original {original} positions is not "
                              f"supported; export with --max-seq-len {original} or less")
        spec.rope = {"type": "default", "theta": spec.rope["theta"]}
        say(f"{role}: dynamic rope scaling runs as the default within its {original} positions")
    if spec.rope.get("type") == "longrope" and max_seq_len > spec.rope["original_max_position_embeddings"]:
        # transformers switches every frequency to the long factors once a sequence passes the original length,
        # keeping the keys cached before: a static graph takes the long ones for every position, as llama.cpp does
        # for a context longer than the original
        spec.rope["long"] = True
        say(f"{role}: LongRoPE's long factors at every position (max_seq_len {max_seq_len} exceeds the original "
            f"{spec.rope['original_max_position_embeddings']}); the check's reference uses them too")
    if spec.rope:
        rope_inv_freq(spec.rope, spec.rotary_dim)          # an unsupported scaling refused before the weights load
    if attention == "gqa" and spec.head_dim % 8:
        raise ExportError(f"{role}: head_dim {spec.head_dim} is not a multiple of 8, which onnxruntime's "
                          "GroupQueryAttention needs; export with --attention standard")
    trained = cfg.get("max_position_embeddings")
    if spec.rope.get("type") == "yarn":                     # what YaRN stretches the original length to
        trained = max(trained or 0, int(spec.rope["original_max_position_embeddings"] * spec.rope["factor"]))
    if spec.family != "gpt2" and isinstance(trained, int) and max_seq_len > trained:
        say(f"{role}: warning: max_seq_len {max_seq_len} exceeds the {trained} positions the model was made for; "
            "text beyond them may degrade")
    if fit_block and quantization is not None:
        quantization = dataclasses.replace(quantization, block_size=fitting_block_size(spec.matrix_input_sizes))
        say(f"{role}: quantization blocks of {quantization.block_size} (a draft's blocks change its speed, not the "
            "output; --draft-block-size sets them)")
    say(f"{role}: opening the weights of {architecture} ({spec.num_layers} layers, hidden {spec.hidden_size})")
    model = skeleton(source)                       # transformers' model without weights: the check's reference
    if spec.rope.get("long"):
        long_rope_everywhere(model)
    source_weights = open_weights(source, model)
    say(f"{role}: weights {source_weights.how}")
    eos_ids, added = source.eos_token_ids()
    if added:
        say(f"{role}: also stops at {', '.join(added)}: end-of-turn tokens its config does not list as eos")
    final = work / f"{role}.onnx"
    path = final
    if dtype != "float32" and run_checks:        # checked as a float32 copy of the same graph (see export_bundle)
        (work / CHECK_DIR).mkdir(exist_ok=True)
        path = work / CHECK_DIR / final.name
    weights_kind = quantization.name if quantization else "float32"
    if path != final:
        say(f"{role}: writing a float32 copy of the step graph for the check ({weights_kind} weights)")
    else:
        say(f"{role}: writing step graph ({weights_kind if quantization else dtype} weights)")
    graph, builder = _write_graph(path, role, spec, family, source_weights, max_seq_len, max_draft, quantization,
                                  attention, quantize_embedding, "float32" if run_checks else dtype)
    half = None
    if dtype != "float32" and run_checks:
        say(f"{role}: writing the {dtype} step graph")
        half = _write_graph(final, role, spec, family, source_weights, max_seq_len, max_draft, quantization,
                            attention, quantize_embedding, dtype)
        half[0].quantized.clear()
    entry = {
        "file": path.name, "architecture": architecture, "source": source.description,
        "source_kind": source.kind, "graph_variant": graph.graph_variant, "max_batch": graph.max_batch,
        # the bundle's own graph: quantized, or in the bundle's dtype (the float32 copy above is only for the check)
        "spec": spec.to_json(), "io": graph.io(), "weights": weights_kind if quantization else dtype,
        "weight_bytes": builder.weight_bytes, "embedding_bytes": graph.embedding_bytes,
        "kv": {"num_layers": spec.num_layers, "num_kv_heads": spec.num_kv_heads, "head_dim": spec.head_dim,
               "dtype": "float32", "slots": graph.kv_slots},
    }
    if not run_checks:
        entry["kv"]["dtype"] = dtype
        entry["export_check"] = {"skipped": "exported unchecked, for timing only (export_bundle(check=False))"}
        return entry, eos_ids
    ids = random_ids(vocab_size)
    quality = None
    # everything the checks need from torch is computed first and the weights freed before onnxruntime loads the
    # graph: the two at once were the export's peak (13.87 GiB for the fp32 1.5B target, 8.88 GiB without)
    overrides = None
    if quantization is not None:
        entry["quantization"] = {**quantization.to_json(), "embedding": graph.quantize_embedding}
        say(f"{role}: running transformers on {len(prompts)} prompts and on the dequantized weights")
        sources_out = source_logits(model, source_weights, prompts, vocab_size)
        overrides = dequantized_overrides(model, source_weights, graph.quantized, quantization)
    reference = reference_logits(model, source_weights, ids, vocab_size, overrides)
    graph.quantized.clear()
    del model, source_weights, overrides
    gc.collect()
    if quantization is not None:                               # the graph deliberately differs from its source
        say(f"{role}: measuring the {weights_kind} graph against the source model on {len(prompts)} prompts")
        quality = prompt_agreement(path, entry, sources_out, prompts, max_seq_len)
        say(f"{role}: top-1 agreement {quality['top1_agreement']:.3f} over {quality['positions']} positions, "
            f"max logit error {quality['max_abs_logit_error']:.3g}")
    say(f"{role}: checking the graph against transformers (prefill + multi-token steps"
        f"{', dequantized weights' if quantization else ''})")
    check = check_graph(path, entry, reference, ids, vocab_size, max_seq_len,
                        " (dequantized weights)" if quantization else "", role)
    limit = tolerance if tolerance is not None else default_tolerance(check["max_abs_logit"], quantization,
                                                                       draft=role == "draft")
    check["tolerance"] = limit
    say(f"{role}: max logit error {check['max_abs_logit_error']:.2e} (tolerance {limit:.2e}), "
        f"top-1 agreement {check['top1_agreement']:.3f}, verify rows bitwise equal to single steps: "
        f"{'yes' if check['verify_rows_bitwise_equal'] else 'NO'}"
        + (f", batch rows bitwise equal to rows alone: {'yes' if check['batch_rows_bitwise_equal'] else 'NO'}"
           if "batch_rows_bitwise_equal" in check else ""))
    if not check["ids_equal_argmax"]:
        raise ExportError(f"{role}: the graph's ids output is not the argmax of its logits; nothing was written")
    if not check["max_abs_logit_error"] <= limit:
        block = "--draft-block-size" if role == "draft" else "--block-size"
        hint = (f" (a quantized model: --accuracy-level 0 computes in float, a smaller {block} quantizes "
                "closer, --tolerance allows more)" if quantization else "")
        raise ExportError(f"{role}: exported graph differs from transformers by {check['max_abs_logit_error']:.3g} "
                          f"(tolerance {limit:.3g}){hint}; nothing was written")
    if role == "target" and not check["verify_rows_bitwise_equal"]:
        say("target: warning: on this CPU the target's verify rows differ from its single steps in the last bits; "
            "greedy speculative output may differ from target-only output at near-ties")
    if role == "target" and check.get("batch_rows_bitwise_equal") is False:
        say("target: warning: on this CPU the target's rows in a batch differ from the same rows run alone in the "
            "last bits; batched greedy output may differ from single-sequence output at near-ties")
    if quality is not None:
        check["vs_source"] = quality
    entry["export_check"] = check
    if half is not None:
        graph, builder = half
        entry.update(io=graph.io(), weight_bytes=builder.weight_bytes, embedding_bytes=graph.embedding_bytes)
        entry["kv"]["dtype"] = dtype
        check["checked_as"] = "a float32 copy of the same graph (half-precision numerics: scripts/gpu_check.py)"
        check["dtype_audit"] = audit_dtype(final, dtype)
        say(f"{role}: {dtype} graph audited: {check['dtype_audit']['summary']}")
        if dtype == "float16":                   # onnxruntime's CPU provider runs float16 graphs (not bfloat16)
            check["float16_on_cpu"] = _half_check(final, entry, reference, ids, vocab_size, max_seq_len,
                                                  quantization, role, say)
    return entry, eos_ids
