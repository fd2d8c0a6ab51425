"""Tool calling: the <tool_call> format read back from replies (whole and streamed), tools and tool messages rendered
as transformers renders them, and the server's `tools` / `tool_choice` with the official client (a scripted target
makes the tiny model write a call)."""

import json

import httpx
import openai
import pytest
import tiny_models as tm
from conftest import TARGET_ROWS, _export
from serve_helpers import MODEL, running, script_target
from test_serve import assert_openai_error, client, post

from specedge.errors import OptionError
from specedge.runtime.chat import render_chat
from specedge.runtime.options import chat_messages, tool_definitions
from specedge.runtime.tool_calls import ToolCall, ToolCallStream, split_tool_calls, template_calls_tools, tool_names

TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools:\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    "Call one as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls is defined %}<|im_start|>assistant\n{{ m.content }}"
    "{% for c in m.tool_calls %}<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
REPLY = "Let me look.\n" + CALL
BARE = '```json\n{\n  "name": "get_weather",\n  "arguments": {"city": "Paris"}\n}\n```'   # the real 1.5B's way
NAMES = tool_names(TOOLS)


def test_calls_are_split_from_the_text_before_them():
    assert split_tool_calls(REPLY) == ("Let me look.\n", [ToolCall("get_weather", '{"city": "Paris"}')])
    two = CALL + "\n" + CALL.replace("Paris", "Oslo").replace("arguments", "parameters") + " and after"
    assert split_tool_calls(two) == (None, [ToolCall("get_weather", '{"city": "Paris"}'),
                                            ToolCall("get_weather", '{"city": "Oslo"}')])
    nested = '<tool_call>{"name": "run", "arguments": {"code": "print(\'<tool_call>\')"}}</tool_call>'
    assert split_tool_calls(nested) == (None, [ToolCall("run", '{"code": "print(\'<tool_call>\')"}')])
    assert split_tool_calls('<tool_call>{"name": "f", "arguments": null}') == (None, [ToolCall("f", "{}")])
    as_text = '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}'          # arguments already JSON text
    assert split_tool_calls(as_text) == (None, [ToolCall("f", '{"a": 1}')])
    for whole in ["no call here", REPLY[:-20], '<tool_call>{"arguments": {}}</tool_call>', "<tool_call>[1]</tool_call>",
                  '<tool_call>{"name": "f"} junk</tool_call>']:
        assert split_tool_calls(whole) == (whole, [])          # cut off or malformed: the text, no call
    assert template_calls_tools(TOOLS_TEMPLATE) and not template_calls_tools(tm.CHAT_TEMPLATE)


def test_a_reply_that_is_only_a_calls_json_is_the_call_where_it_names_a_given_tool():
    paris = [ToolCall("get_weather", '{"city": "Paris"}')]
    assert split_tool_calls(BARE, NAMES) == (None, paris)
    assert split_tool_calls(' {"name": "get_weather", "parameters": {"city": "Paris"}} ', NAMES) == (None, paris)
    assert split_tool_calls('[{"name": "get_weather", "arguments": {"city": "Paris"}}]', NAMES) == (None, paris)
    for text in [BARE.replace("get_weather", "other"), '{"name": "get_weather", "arguments": {}, "x": 1}',
                 '{"city": "Paris"}', "Sure: " + BARE, BARE[:-3], "```python\nprint(1)\n```", "[]"]:
        assert split_tool_calls(text, NAMES) == (text, [])
    assert split_tool_calls(BARE) == (BARE, [])                             # no tools given: no bare calls


@pytest.mark.parametrize("text", [REPLY, "just text <tool", "a <tool_c> b", CALL, "x" + CALL[:-3], BARE,
                                  "  {\"not\": \"a call\"}", "```python\nprint(1)\n```", "`x`"])
def test_a_streamed_reply_sends_its_text_and_holds_back_only_a_call(text):
    whole_content, whole_calls = split_tool_calls(text, NAMES)
    for cut in range(1, len(text)):
        for pieces in ([text[:cut], text[cut:]], list(text)):
            stream = ToolCallStream(NAMES)
            sent = "".join(stream.feed(piece) for piece in pieces)
            assert "<tool_call>" not in sent
            rest, calls = stream.finish()
            assert calls == whole_calls and sent + rest == (whole_content or "" if calls else text)


def test_tools_and_tool_messages_render_as_transformers_renders_them():
    """OpenAI carries a call's arguments as JSON text; templates get them as a dict (as vLLM hands them over)."""
    tok = tm.byte_tokenizer(chat=True)
    tok.chat_template = TOOLS_TEMPLATE
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    as_dicts = [*messages[:1], {"role": "assistant", "content": "",
                                "tool_calls": [{**call, "function": {"name": "get_weather",
                                                                     "arguments": {"city": "Paris"}}}]}, messages[2]]
    expected = tok.apply_chat_template(as_dicts, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert render_chat(TOOLS_TEMPLATE, chat_messages(messages), None, None, tools=tool_definitions(TOOLS)) == expected
    bare = [{"type": "function", "function": {"name": "now"}}]          # OpenAI allows a tool without parameters
    assert '"parameters": {"type": "object", "properties": {}}' in render_chat(
        TOOLS_TEMPLATE, chat_messages(messages[:1]), None, None, tools=tool_definitions(bare))
    assert "<tool_response>\nsunny" in expected and '"arguments": {"city": "Paris"}' in expected
    for bad in ["x", [{"type": "function"}], [{"type": "function", "function": {"name": ""}}],
                [{"type": "function", "function": {"name": "f", "parameters": []}}]]:
        with pytest.raises(OptionError, match="tools"):
            tool_definitions(bad)
    with pytest.raises(OptionError, match="tool_calls"):
        chat_messages([{"role": "assistant", "content": None, "tool_calls": [{"function": {}}]}])


@pytest.fixture(scope="module")
def tool_bundle(workdir):
    """A standard qwen2 pair with room for a tool definition and a call (the byte tokenizer spends a token a byte)."""
    if (workdir / "tools-chat" / "manifest.json").exists():               # exported once per session
        return workdir / "tools-chat"
    target = tm.make_model("qwen2", TARGET_ROWS, seed=1)
    draft = tm.perturbed(target, seed=3, noise=0.01)
    return _export(workdir, "tools-chat", target, draft, tm.byte_tokenizer(chat=True), attention="standard",
                   max_seq_len=768)


def _scripted(gen, messages, reply: str, tools=TOOLS):
    ids = gen.tokenizer.encode(reply, add_special_tokens=False).ids
    script_target(gen, ids, len(gen.encode_messages(messages, tools=tools)))


def test_the_server_returns_a_call_whole_and_streamed_and_takes_the_result_back(tool_bundle):
    with running(tool_bundle) as (srv, gen):
        gen.chat_template = TOOLS_TEMPLATE
        messages = [{"role": "user", "content": "What is the weather in Paris?"}]
        _scripted(gen, messages, REPLY)
        c = client(srv)
        r = c.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=120, temperature=0)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me look.\n"
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris"}

        content, calls, finish = "", {}, None
        for part in c.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=120,
                                              temperature=0, stream=True):
            if not part.choices:
                continue
            delta = part.choices[0].delta
            content += delta.content or ""
            for tc in delta.tool_calls or []:
                calls[tc.index] = tc
            finish = part.choices[0].finish_reason or finish
        assert content == "Let me look.\n" and finish == "tool_calls"
        assert calls[0].function.name == "get_weather" and json.loads(calls[0].function.arguments) == {"city": "Paris"}

        # the next turn: the reply as the client dumps it (empty refusal, annotations, ...) and the result go back in
        follow = [*messages, choice.message.model_dump(), {"role": "tool", "tool_call_id": call.id,
                                                           "content": "sunny, 21 C"}]
        _scripted(gen, follow, "It is sunny.")
        again = c.chat.completions.create(model=MODEL, messages=follow, tools=TOOLS, max_tokens=40, temperature=0)
        assert again.choices[0].message.content == "It is sunny." and again.choices[0].finish_reason == "stop"
        assert not again.choices[0].message.tool_calls

        # two calls; parallel_tool_calls false keeps the first (OpenAI promises at most one then)
        _scripted(gen, messages, CALL + CALL.replace("Paris", "Oslo"))
        both = c.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=160, temperature=0)
        cities = [json.loads(t.function.arguments)["city"] for t in both.choices[0].message.tool_calls]
        assert cities == ["Paris", "Oslo"]
        assert both.choices[0].message.content is None
        one = c.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=160, temperature=0,
                                        parallel_tool_calls=False)
        assert len(one.choices[0].message.tool_calls) == 1

        # the call's JSON alone in a fence (small models leave the tags out): the call, whole and streamed
        _scripted(gen, messages, BARE)
        fenced = c.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=120, temperature=0)
        assert fenced.choices[0].finish_reason == "tool_calls" and fenced.choices[0].message.content is None
        assert fenced.choices[0].message.tool_calls[0].function.name == "get_weather"
        parts = [p for p in c.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=120,
                                                      temperature=0, stream=True) if p.choices]
        assert "".join(p.choices[0].delta.content or "" for p in parts) == ""
        assert [tc.function.name for p in parts for tc in p.choices[0].delta.tool_calls or []] == ["get_weather"]

        # tool_choice "none": the tools stay out of the prompt and nothing is parsed
        _scripted(gen, messages, REPLY, tools=None)
        plain = c.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="none",
                                          max_tokens=120, temperature=0)
        assert plain.choices[0].message.content == REPLY and plain.choices[0].finish_reason == "stop"


def test_tool_requests_the_server_cannot_honour_are_400s(tool_bundle):
    with running(tool_bundle) as (srv, gen):
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        # this bundle's own template has no tool format: refused rather than left unparsed
        assert_openai_error(post(srv, "/chat/completions", {**chat, "tools": TOOLS}), 400, "tools")
        gen.chat_template = TOOLS_TEMPLATE
        for body, param in [({**chat, "tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
                            ({**chat, "tools": TOOLS, "tool_choice": {"type": "function",
                                                                      "function": {"name": "elsewhere"}}},
                             "tool_choice"),
                            ({**chat, "tools": TOOLS, "tool_choice": "required",
                              "response_format": {"type": "json_object"}}, "response_format"),
                            ({**chat, "tools": [{"type": "function"}]}, "tools"),
                            ({**chat, "tool_choice": "auto"}, "tool_choice"),
                            ({**chat, "chat_template_kwargs": {"namespace": 1}}, "chat_template_kwargs"),
                            ({**chat, "chat_template_kwargs": {"self": 1}}, "chat_template_kwargs"),
                            ({**chat, "messages": [{"role": "assistant", "content": None,
                                                    "tool_calls": [{"function": {}}]}]}, "messages")]:
            assert_openai_error(post(srv, "/chat/completions", body), 400, param)
        # a forced tool whose parameters no grammar can hold: said in the request's terms (it sent no response_format)
        broken = [{"type": "function", "function": {"name": "f", "parameters": {"type": "bogus"}}}]
        err = assert_openai_error(post(srv, "/chat/completions", {**chat, "tools": broken, "tool_choice": "required"}),
                                  400, "tool_choice")
        assert err["message"].startswith("the forced tool's parameters: the JSON schema is not usable"), err
        # a lone surrogate (valid JSON, not text) in a tool's description: a 400, not the tokenizer's 500
        lone = {**chat, "tools": [{"type": "function", "function": {"name": "f", "description": "\ud800"}}]}
        raw = httpx.post(srv.url + "/chat/completions", content=json.dumps(lone).encode(), timeout=10)
        assert "not valid Unicode" in assert_openai_error(raw, 400, "messages")["message"]
        ok = post(srv, "/chat/completions", {**chat, "tools": TOOLS, "tool_choice": "auto",
                                             "parallel_tool_calls": False})
        assert ok.status_code == 200, ok.text
        with pytest.raises(openai.BadRequestError, match="legacy"):
            client(srv).chat.completions.create(model=MODEL, messages=chat["messages"], max_tokens=2,
                                                functions=[{"name": "f"}])


UNITS = [{"type": "function", "function": {"name": name, "parameters": {
    "type": "object", "properties": {"unit": {"enum": ["c", "f"]}}, "required": ["unit"],
    "additionalProperties": False}}}
    for name in ("temperature", "humidity")]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "humidity"}}])
def test_a_forced_call_is_held_to_the_tools_grammar_even_for_a_model_that_never_calls(tool_bundle, choice):
    """tool_choice "required" or a named function: the reply is decoded under the grammar of such a call (exact
    under speculation, as any response_format), so even the tiny random model returns a valid call."""
    with running(tool_bundle) as (srv, gen):
        gen.chat_template = TOOLS_TEMPLATE
        messages = [{"role": "user", "content": "how warm?"}]
        for stream in (False, True):
            kwargs = dict(model=MODEL, messages=messages, tools=UNITS, tool_choice=choice, max_tokens=60,
                          temperature=0)
            if stream:
                parts = [p for p in client(srv).chat.completions.create(stream=True, **kwargs) if p.choices]
                calls = [tc for p in parts for tc in p.choices[0].delta.tool_calls or []]
                finish = parts[-1].choices[0].finish_reason
            else:
                reply = client(srv).chat.completions.create(**kwargs).choices[0]
                calls, finish = reply.message.tool_calls, reply.finish_reason
            assert finish == "tool_calls" and len(calls) == 1
            assert calls[0].function.name in ({"humidity"} if isinstance(choice, dict) else {"temperature", "humidity"})
            assert json.loads(calls[0].function.arguments)["unit"] in ("c", "f")


def test_tool_call_ids_are_unique_across_choices():
    """n choices in one response: choice 0's ids as with n = 1, the others' carry their index (OpenAI's and vLLM's
    ids are unique per call)."""
    from specedge.serve import protocol

    req = protocol.ParsedRequest("chat", "m", [1], {}, tools=frozenset({"get_weather"}), n=2)
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    out = protocol.response(req, [protocol.Choice(text, "eos"), protocol.Choice(text, "eos")], 2, 0, {})
    ids = [choice["message"]["tool_calls"][0]["id"] for choice in out["choices"]]
    assert ids == [f"call_{req.id}_0", f"call_{req.id}_1_0"]
    streamed = protocol.chunk(req, None, calls=[split_tool_calls(text, req.tools)[1][0]], index=1)
    assert streamed["choices"][0]["delta"]["tool_calls"][0]["id"] == ids[1]
