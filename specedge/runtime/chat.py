"""Renders a bundle's chat template (Jinja, as transformers does) into a prompt string."""

from __future__ import annotations

import json

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from specedge.errors import BundleError


def _raise(message: str):
    raise TemplateError(message)


def render_chat(template: str, messages: list[dict], bos_token: str | None, eos_token: str | None) -> str:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda value, indent=None, **_: json.dumps(value, indent=indent, ensure_ascii=False)
    env.globals["raise_exception"] = _raise
    try:
        return env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                                bos_token=bos_token or "", eos_token=eos_token or "")
    except TemplateError as err:
        raise BundleError(f"the bundle's chat template failed: {err}") from err
