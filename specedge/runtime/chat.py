"""Renders a bundle's chat template (Jinja, as transformers does) into a prompt string."""

from __future__ import annotations

import json
from datetime import datetime

from jinja2 import TemplateError, Undefined, nodes
from jinja2.defaults import DEFAULT_NAMESPACE
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from specedge.errors import BundleError


def _raise(message: str):
    raise TemplateError(message)


class _GenerationBlock(Extension):
    """transformers' `{% generation %}...{% endgeneration %}`: it marks the assistant's text for training masks;
    for inference, rendering the block is rendering its body."""

    tags = {"generation"}

    def parse(self, parser) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


# what a template may call: jinja's own globals and transformers' additions; template variables may not shadow them
TEMPLATE_GLOBALS = (*DEFAULT_NAMESPACE, "raise_exception", "strftime_now")


def _tojson(value, indent=None, **_) -> str:
    if isinstance(value, Undefined):
        raise TemplateError("tojson of an undefined value")
    return json.dumps(value, indent=indent, ensure_ascii=False)


def render_chat(template: str, messages: list[dict], bos_token: str | None, eos_token: str | None,
                template_kwargs: dict | None = None, tools: list[dict] | None = None) -> str:
    """template_kwargs: further variables the template reads (Qwen3's `enable_thinking`, as transformers'
    apply_chat_template(**kwargs) passes them); they cannot replace messages, add_generation_prompt or the tokens.
    tools: OpenAI-style tool definitions ({"type": "function", "function": {...}}), given to the template as
    `tools` (None: the variable is left undefined, as transformers leaves it)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols", _GenerationBlock])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)      # as transformers provides it
    try:
        extra = {**(template_kwargs or {}), **({"tools": tools} if tools else {})}
        return env.from_string(template).render(**extra, messages=messages, add_generation_prompt=True,
                                                bos_token=bos_token or "", eos_token=eos_token or "")
    except Exception as err:  # noqa: BLE001 - a template's error on these messages is whatever Python raised in it
        raise BundleError(f"the bundle's chat template failed: {err}") from err
