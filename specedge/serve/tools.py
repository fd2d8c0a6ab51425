"""Tool calling on the HTTP side: which tools a chat request gives the template, the grammar a forced call is
decoded under, and the calls of a reply in OpenAI's shape (runtime/tool_calls.py reads them out of the text)."""

from __future__ import annotations

from specedge.errors import OptionError
from specedge.runtime.options import tool_definitions
from specedge.runtime.tool_calls import ToolCall, template_calls_tools
from specedge.serve.errors import invalid


def requested_tools(body: dict, gen) -> list[dict] | None:
    """The tools to give the template, or None: 'tool_choice' "auto" (the default with tools) lets the model call
    them, "required" or a named function makes it call one (see forced_call), "none" leaves them out of the prompt.
    Calls are read back in the <tool_call> format (runtime/tool_calls.py): a template that does not ask for it is
    refused rather than left unparsed."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if choice is not None and choice not in ("auto", "none", "required") and not _named(choice):
        raise invalid("'tool_choice' must be 'auto', 'none', 'required' or {'type': 'function', 'function': "
                      "{'name': ...}}", "tool_choice")
    if choice not in (None, "none") and not tools:
        raise invalid("'tool_choice' needs 'tools'", "tool_choice")
    if not tools or choice == "none":
        return None
    if not template_calls_tools(gen.chat_template):
        raise invalid("this model's chat template does not ask for tool calls in the <tool_call> format that this "
                      "server parses (Qwen2.5, Qwen3, Hermes-style templates)", "tools")
    try:
        return tool_definitions(tools)
    except OptionError as err:
        raise invalid(str(err), "tools") from None


def _named(choice) -> str | None:
    function = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    return function.get("name") if isinstance(function, dict) and isinstance(function.get("name"), str) else None


def forced_call(body: dict, tools: list[dict] | None) -> dict | None:
    """tool_choice "required" or a named function -> the response_format that holds the reply to such a call: the
    call's JSON object alone, {"name": one of the tools, "arguments": what its parameters' schema allows}, which
    runtime/tool_calls.py reads as a bare call. None where the model chooses."""
    choice = body.get("tool_choice")
    if not tools or choice in (None, "auto", "none"):
        return None
    name = _named(choice)
    chosen = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
    if not chosen:
        raise invalid(f"'tool_choice' names '{name}', which is not one of the tools", "tool_choice")
    calls = [{"type": "object", "properties": {"name": {"const": f["name"]}, "arguments": f["parameters"]},
              "required": ["name", "arguments"], "additionalProperties": False} for f in chosen]
    # compact JSON: a model held to a grammar it did not choose may otherwise fill the allowed whitespace
    schema = {**(calls[0] if len(calls) == 1 else {"anyOf": calls}), "x-guidance": {"whitespace_flexible": False}}
    return {"type": "json_schema", "json_schema": {"name": "tool_call", "schema": schema}}


def message_tool_calls(request_id: str, calls: list[ToolCall], first_only: bool) -> list[dict]:
    """OpenAI's tool_calls of a message (ids unique to the request); the first only where parallel calls were
    turned off (OpenAI promises at most one then)."""
    calls = calls[:1] if first_only else calls
    return [{"id": f"call_{request_id}_{i}", "type": "function",
             "function": {"name": call.name, "arguments": call.arguments}} for i, call in enumerate(calls)]
