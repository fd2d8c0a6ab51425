"""The bundle manifest: the one contract between exporter and runtime, versioned and checked before loading.

manifest.json (format_version 3; version 2 bundles, float32 only, are read too)
  format            "specedge-bundle"
  format_version    FORMAT_VERSION; other versions are refused with a re-export message
  vocab_size        rows of every full logits output (padding rows sliced off at export)
  eos_token_ids     generation stops after any of these
  max_seq_len       committed tokens a sequence may hold (prompt + output)
  max_draft         largest k a verify call was exported and checked for
  dtype             "float32" | "float16" | "bfloat16": weights, activations and KV buffers of both graphs
                    (norms, softmax and logits in float32 either way; runtime/backends say which they run)
  tokenizer         {"file", "chat_template" (file or null), "bos_token", "eos_token"}
  models            {"target": MODEL, "draft": MODEL (absent for a target-only bundle)}
  engines           {} (reserved: compiled engines per backend, with what they were built for)
                    engines["tensorrt"] (written by `specedge build --tensorrt`, experimental): TensorRT, CUDA and
                    driver versions, GPU name and compute capability, hardware-compatibility level, max_batch,
                    max_step, and per model its engine file, bytes, SHA-256, source graph's SHA-256 and optimization
                    profiles (engine files are listed in "files" too); full shape: specedge/engines/tensorrt_record.py
  files             {relative path: {"bytes", "sha256"}} for every file of the bundle
MODEL
  file, architecture, source, source_kind, spec (ModelSpec fields), weights, weight_bytes, embedding_bytes
  graph_variant     one of GRAPH_VARIANTS
  max_batch         rows one call may carry: null (any) or 1 (gqa: GroupQueryAttention refuses several
                    new tokens per row after a past when B > 1)
  kv                {"num_layers", "num_kv_heads", "head_dim", "dtype" (the bundle's), "slots"}: each buffer is
                    [B, num_kv_heads, slots, head_dim]; slots - max_seq_len is headroom for pad rows
  io                {"inputs": {NAME: TENSOR}, "outputs": {NAME: TENSOR},
                     "kv": [[past_key, past_value, present_key, present_value] per layer]}
                    TENSOR = {"dtype": "int64" | "float32" | "float16" | "bfloat16", "shape": [int or name]}
  quantization, export_check

The step graph's I/O (every variant):
  input_ids      int64 [B, T]                 row b's tokens
  position_ids   int64 [B, T]                 start_b .. start_b + T - 1: row b writes K/V at these slots
  logit_rows     int64 [B, n]                 which of the T rows return logits / ids (indices into T)
  past_key.{i}   float [B, H_kv, slots, D]    the static buffer of layer i, bound once per call shape
  logits         float [B, n, V_head]
  ids            int64 [B, n]                 argmax of each returned row, first index on ties, mapped to
                                              the full vocabulary's ids (a lighter head's columns)
  present_key.{i} float [B, H_kv, slots, D]   the same memory as past_key.{i}: K/V written in place
A query at position p sees slots j <= p. Slots at or beyond a row's committed length are scratch: the
runtime pads rows (repeating the last token at the following positions) and writes dummy rows there.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path, PurePosixPath

from specedge.errors import BundleError

FORMAT = "specedge-bundle"
FORMAT_VERSION = 3
READABLE_VERSIONS = (2, 3)     # 3 added half-precision bundles and engine records; 2 reads as is
DTYPES = ("float32", "float16", "bfloat16")
MANIFEST = "manifest.json"
SPEC_INTS = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "vocab_size")
GRAPH_VARIANTS = ("static-kv-standard-v1", "static-kv-gqa-v3")
STEP_INPUTS = ("input_ids", "position_ids", "logit_rows")
STEP_OUTPUTS = ("logits", "ids")


def sha256_of(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def file_record(path: Path) -> dict:
    return {"bytes": path.stat().st_size, "sha256": sha256_of(path)}


def read_manifest(bundle: str | Path, verify_hashes: bool = False) -> dict:
    """Reads and validates BUNDLE/manifest.json; checks every listed file exists with its size."""
    root = Path(bundle)
    if root.exists() and not root.is_dir():
        raise BundleError(f"{bundle}: is not a folder (a bundle is a folder)")
    if not root.is_dir():
        raise BundleError(f"{bundle}: no such bundle folder")
    path = root / MANIFEST
    if not path.exists():
        raise BundleError(f"{bundle}: not a specedge bundle (no {MANIFEST})")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BundleError(f"{path}: corrupt manifest ({err})") from err
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BundleError(f"{path}: not a specedge bundle manifest")
    version = manifest.get("format_version")
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise BundleError(f"{bundle}: bundle format version {version!r} is not supported by this specedge "
                          f"(it reads versions {', '.join(map(str, READABLE_VERSIONS))}); re-export the bundle "
                          "with this version")
    for key in ("vocab_size", "eos_token_ids", "max_seq_len", "max_draft", "dtype", "tokenizer", "models", "files"):
        if key not in manifest:
            raise BundleError(f"{path}: manifest lacks '{key}'")
    if manifest["dtype"] not in DTYPES:
        raise BundleError(f"{path}: unknown dtype '{manifest['dtype']}' (known: {', '.join(DTYPES)})")
    _check_fields(path, manifest)
    if "target" not in manifest["models"]:
        raise BundleError(f"{path}: manifest has no target model")
    for role, model in manifest["models"].items():
        _check_model(bundle, role, model, manifest)
    _check_listed(path, manifest)
    for rel, record in manifest["files"].items():
        file = root / rel
        if not file.is_file():
            raise BundleError(f"{bundle}: missing file {rel}")
        if file.stat().st_size != record["bytes"]:
            raise BundleError(f"{bundle}: {rel} is corrupt (size {file.stat().st_size}, expected {record['bytes']})")
        if verify_hashes and sha256_of(file) != record["sha256"]:
            raise BundleError(f"{bundle}: {rel} is corrupt (checksum mismatch)")
    return manifest


def _count(value, least: int) -> bool:
    return type(value) is int and value >= least


def _check_fields(path: Path, m: dict) -> None:
    """Types and ranges of the top-level fields the runtime reads: a hand-edited manifest is refused in one line
    here rather than failing somewhere inside a generation."""
    def need(ok: bool, what: str) -> None:
        if not ok:
            raise BundleError(f"{path}: corrupt manifest: {what}")
    need(_count(m["vocab_size"], 2), f"vocab_size must be an integer >= 2, got {m['vocab_size']!r}")
    need(_count(m["max_seq_len"], 2), f"max_seq_len must be an integer >= 2, got {m['max_seq_len']!r}")
    need(_count(m["max_draft"], 1), f"max_draft must be an integer >= 1, got {m['max_draft']!r}")
    eos = m["eos_token_ids"]
    need(isinstance(eos, list) and eos and all(_count(i, 0) and i < m["vocab_size"] for i in eos),
         f"eos_token_ids must be a non-empty list of token ids below vocab_size, got {eos!r}")
    tok = m["tokenizer"]
    need(isinstance(tok, dict) and isinstance(tok.get("file"), str), "tokenizer must name its 'file'")
    need(tok.get("chat_template") is None or isinstance(tok["chat_template"], str),
         "tokenizer.chat_template must be a file name or null")
    need(isinstance(m["models"], dict) and all(isinstance(v, dict) for v in m["models"].values()),
         "models must map roles to model entries")
    need(isinstance(m["files"], dict) and all(isinstance(r, dict) and _count(r.get("bytes"), 0)
                                              and isinstance(r.get("sha256"), str) for r in m["files"].values()),
         "files must map each file to its 'bytes' and 'sha256'")
    names = [*m["files"], tok["file"]] + ([tok["chat_template"]] if tok.get("chat_template") else [])
    names += [model.get("file") for model in m["models"].values() if isinstance(model.get("file"), str)]
    outside = [name for name in names if not _inside(name)]
    need(not outside, f"file names must name files in the bundle's folder, got {outside[0]!r}" if outside else "")


def _inside(name: str) -> bool:
    """A path within the bundle's folder (engines/... included): relative, no parent, nothing hidden."""
    parts = PurePosixPath(name).parts
    return bool(parts) and not name.startswith("/") and "\\" not in name and \
        not any(part.startswith(".") for part in parts)


def _check_listed(path: Path, m: dict) -> None:
    """Every file the runtime opens is listed in `files` (so sizes are checked at load, hashes by --verify)."""
    used = [m["tokenizer"]["file"]] + [model["file"] for model in m["models"].values()]
    used += [f"{f}.data" for f in used[1:] if (path.parent / f"{f}.data").exists()]     # external weights
    if m["tokenizer"].get("chat_template"):
        used.append(m["tokenizer"]["chat_template"])
    unlisted = [f for f in used if f not in m["files"]]
    if unlisted:
        raise BundleError(f"{path}: corrupt manifest: 'files' does not list {', '.join(unlisted)}")


def _check_model(bundle, role: str, model: dict, manifest: dict) -> None:
    if model.get("graph_variant") not in GRAPH_VARIANTS:
        raise BundleError(f"{bundle}: {role} graph variant '{model.get('graph_variant')}' is unknown "
                          f"(known: {', '.join(GRAPH_VARIANTS)})")
    for key in ("file", "kv", "io", "max_batch", "spec", "weight_bytes"):
        if key not in model:
            raise BundleError(f"{bundle}: {role} model entry lacks '{key}'")
    if not isinstance(model["spec"], dict) or not all(_count(model["spec"].get(key), 1) for key in SPEC_INTS) or \
            not _count(model["weight_bytes"], 0):
        raise BundleError(f"{bundle}: corrupt manifest: the {role} entry needs a 'spec' with integer "
                          f"{', '.join(SPEC_INTS)} and an integer 'weight_bytes'")
    io = model["io"]
    if not all(isinstance(io.get(key), dict if key != "kv" else list) for key in ("inputs", "outputs", "kv")):
        raise BundleError(f"{bundle}: {role} io must name 'inputs', 'outputs' and 'kv'")
    missing = [n for n in STEP_INPUTS if n not in io["inputs"]] + [n for n in STEP_OUTPUTS if n not in io["outputs"]]
    if missing:
        raise BundleError(f"{bundle}: {role} io lacks {', '.join(missing)}")
    if "vocab_subset" in model:
        raise BundleError(f"{bundle}: its {role} has a lighter LM head (--draft-vocab), which this specedge no "
                          "longer runs; re-export the bundle without --draft-vocab")
    kv = model["kv"]
    if not isinstance(model["file"], str) or not isinstance(kv, dict) or not all(
            _count(kv.get(key), 1) for key in ("num_layers", "num_kv_heads", "head_dim", "slots")):
        raise BundleError(f"{bundle}: corrupt manifest: the {role} entry needs a 'file' name and 'kv' with integer "
                          "num_layers, num_kv_heads, head_dim and slots")
    if kv.get("dtype", "float32") not in DTYPES:
        raise BundleError(f"{bundle}: corrupt manifest: {role} kv dtype '{kv.get('dtype')}' is unknown "
                          f"(known: {', '.join(DTYPES)})")
    if manifest.get("format_version", 0) >= 3 and kv.get("dtype", "float32") != manifest["dtype"]:
        raise BundleError(f"{bundle}: corrupt manifest: {role} kv dtype {kv.get('dtype')} but the bundle's dtype "
                          f"is {manifest['dtype']}")
    for names in io["kv"] if isinstance(io["kv"], list) else []:
        declared = io["inputs"].get(names[0], {}).get("shape") if isinstance(names, list) and names else None
        if isinstance(declared, list) and declared[1:] != [kv["num_kv_heads"], kv["slots"], kv["head_dim"]]:
            raise BundleError(f"{bundle}: corrupt manifest: {role} input {names[0]} is {declared[1:]} a row, kv "
                              f"says {[kv['num_kv_heads'], kv['slots'], kv['head_dim']]}")
    if model["max_batch"] is not None and not _count(model["max_batch"], 1):
        raise BundleError(f"{bundle}: corrupt manifest: {role} max_batch must be null or an integer >= 1")
    # the exporter's headroom for pad rows beyond max_seq_len (step_graph.py): 2, plus max_draft without gqa
    headroom = 2 + (0 if model["graph_variant"].startswith("static-kv-gqa") else manifest["max_draft"])
    if kv["slots"] < manifest["max_seq_len"] + headroom:
        raise BundleError(f"{bundle}: corrupt manifest: the {role} graph has {kv['slots']} KV slots, too few for "
                          f"max_seq_len {manifest['max_seq_len']} (needs {manifest['max_seq_len'] + headroom})")
    width = io["outputs"]["logits"].get("shape", [None])[-1] if isinstance(io["outputs"]["logits"], dict) else None
    if isinstance(width, int) and width != manifest["vocab_size"]:
        raise BundleError(f"{bundle}: corrupt manifest: the {role} graph returns {width} logits a row, vocab_size "
                          f"says {manifest['vocab_size']}")
    if len(io["kv"]) != model["kv"]["num_layers"]:
        raise BundleError(f"{bundle}: {role} io names {len(io['kv'])} KV layers, kv says {model['kv']['num_layers']}")
    differ = [key for key in ("num_layers", "num_kv_heads", "head_dim") if model["spec"][key] != kv[key]]
    if differ:
        raise BundleError(f"{bundle}: corrupt manifest: the {role} spec and kv disagree on {', '.join(differ)} "
                          f"(spec {[model['spec'][key] for key in differ]}, kv {[kv[key] for key in differ]})")
