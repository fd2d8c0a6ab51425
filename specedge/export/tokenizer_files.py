"""Writes the tokenizer (tokenizer.json) and the chat template into the bundle."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from specedge.errors import BundleError, ExportError
from specedge.runtime.chat import render_chat


def write_tokenizer(tokenizer, work: Path, say=lambda line: None) -> dict:
    """-> the manifest's tokenizer entry. A chat template the runtime cannot render is left out, said aloud (the
    bundle then answers chat requests with a clear refusal instead of failing at each one)."""
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
        name = "default" if "default" in template else next(iter(template))
        if name != "default":
            say(f"warning: the source names chat templates {', '.join(template)} and none 'default'; took '{name}'")
        template = template[name]
    if template:
        try:
            render_chat(template, [{"role": "user", "content": "hi"}], tokenizer.bos_token, tokenizer.eos_token)
        except BundleError as err:
            say(f"warning: {err}; the bundle is written without a chat template (--chat and chat requests refuse)")
            template = None
    if template:
        (work / "chat_template.jinja").write_text(template)
    return {
        "file": "tokenizer.json",
        "chat_template": "chat_template.jinja" if template else None,
        "bos_token": tokenizer.bos_token,
        "eos_token": tokenizer.eos_token,
    }
