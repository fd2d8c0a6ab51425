"""The bundle manifest: versioned, self-describing, checked before anything is loaded.

manifest.json
  format            "specedge-bundle"
  format_version    FORMAT_VERSION; other versions are refused
  vocab_size        rows of every logits output (padding rows sliced off at export)
  eos_token_ids     generation stops after any of these
  max_seq_len       S_max of every KV buffer
  max_draft         largest k a verify call was exported and checked for
  dtype             "float32"
  tokenizer         {"file", "chat_template" (file or null), "bos_token", "eos_token"}
  models            {"target": MODEL, "draft": MODEL (absent for a target-only bundle)}
  files             {relative path: {"bytes", "sha256"}} for every file of the bundle
MODEL
  file, architecture, source, graph_variant, spec (ModelSpec fields), io {"inputs", "outputs"},
  kv {"num_layers", "num_kv_heads", "head_dim", "dtype"}, export_check {...}
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from specedge.errors import BundleError

FORMAT = "specedge-bundle"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
KNOWN_GRAPH_VARIANTS = ("static-kv-scatter-v1", "static-kv-scatter-v2", "static-kv-gqa-v1", "static-kv-gqa-v2")


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
    if version != FORMAT_VERSION:
        raise BundleError(f"{bundle}: bundle format version {version} is not supported by this specedge "
                          f"(it reads version {FORMAT_VERSION}); re-export the bundle")
    for key in ("vocab_size", "eos_token_ids", "max_seq_len", "max_draft", "tokenizer", "models", "files"):
        if key not in manifest:
            raise BundleError(f"{path}: manifest lacks '{key}'")
    if "target" not in manifest["models"]:
        raise BundleError(f"{path}: manifest has no target model")
    for role, model in manifest["models"].items():
        if model.get("graph_variant") not in KNOWN_GRAPH_VARIANTS:
            raise BundleError(f"{bundle}: {role} graph variant '{model.get('graph_variant')}' is unknown")
    for rel, record in manifest["files"].items():
        file = root / rel
        if not file.exists():
            raise BundleError(f"{bundle}: missing file {rel}")
        if file.stat().st_size != record["bytes"]:
            raise BundleError(f"{bundle}: {rel} is corrupt (size {file.stat().st_size}, expected {record['bytes']})")
        if verify_hashes and sha256_of(file) != record["sha256"]:
            raise BundleError(f"{bundle}: {rel} is corrupt (checksum mismatch)")
    return manifest
