"""Writes the tokenizer (tokenizer.json) and the chat template into the bundle."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from specedge.errors import ExportError


def write_tokenizer(tokenizer, work: Path) -> dict:
    if not getattr(tokenizer, "is_fast", False):
        raise ExportError("the source has no fast tokenizer (tokenizer.json); the runtime needs one")
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        saved = Path(tmp) / "tokenizer.json"
        if not saved.exists():
            raise ExportError("the tokenizer could not be saved as tokenizer.json")
        shutil.copyfile(saved, work / "tokenizer.json")
    template = tokenizer.chat_template
    if isinstance(template, dict):
        template = template.get("default") or next(iter(template.values()))
    if template:
        (work / "chat_template.jinja").write_text(template)
    return {
        "file": "tokenizer.json",
        "chat_template": "chat_template.jinja" if template else None,
        "bos_token": tokenizer.bos_token,
        "eos_token": tokenizer.eos_token,
    }
