"""Reasoning models' thinking (<think>...</think>) apart from the answer: split whole and streamed (every cut of the
text gives the same parts), and the server's reasoning_content, with a tool call after the thinking, with the block
opened by the prompt, and turned off (a scripted target writes the replies)."""

import json

import pytest
from serve_helpers import MODEL, running, script_target
from test_serve import client
from test_tool_calls import CALL, TOOLS, tool_bundle  # noqa: F401 - the fixture, shared

from specedge.runtime.reasoning import ReasoningStream, split_reasoning

# Qwen3-like: the assistant's earlier turns lose their thinking; OPENED ends the generation prompt inside <think>
THINKING = ("{% for m in messages %}<|im_start|>{{ m.role }}\n"
            "{% if m.role == 'assistant' and '</think>' in m.content %}{{ m.content.split('</think>')[-1] | trim }}"
            "{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
OPENED = THINKING.replace("<|im_start|>assistant\n{% endif %}", "<|im_start|>assistant\n<think>\n{% endif %}")
REPLY = "<think>\nTwo and two.\n</think>\n\nIt is 4."


@pytest.mark.parametrize("text,opened,parts", [
    (REPLY, False, ("Two and two.", "It is 4.")),
    ("  <think>x</think>y", False, ("x", "y")),
    ("plain answer", False, (None, "plain answer")),
    ("<think>\ncut off while thinking", False, ("cut off while thinking", "")),
    ("Two and two.\n</think>\n\nIt is 4.", True, ("Two and two.", "It is 4.")),
    ("a </th b </think> c", True, ("a </th b", "c")),
    ("<think></think>", False, (None, "")),
    ("<think>\nagain</think> ok", True, ("again", "ok")),                  # opened, and written once more
    ("<thi", False, (None, "<thi"))])
def test_thinking_splits_the_same_whole_and_streamed(text, opened, parts):
    assert split_reasoning(text, opened) == parts
    for cut in range(len(text) + 1):
        for pieces in ([text[:cut], text[cut:]], list(text)):
            stream, thought, answer = ReasoningStream(opened), "", ""
            for piece in [*pieces, None]:
                a, b = stream.feed(piece) if piece is not None else stream.finish()
                thought, answer = thought + a, answer + b
            assert (thought or None, answer) == parts


def _ask(srv, gen, template, reply, tools=None):
    gen.chat_template = template
    messages = [{"role": "user", "content": "2 + 2?"}]
    script_target(gen, gen.tokenizer.encode(reply, add_special_tokens=False).ids,
                  len(gen.encode_messages(messages, tools=tools)))
    kwargs = dict(model=MODEL, messages=messages, max_tokens=200, temperature=0, **({"tools": tools} if tools else {}))
    whole = client(srv).chat.completions.create(**kwargs).choices[0]
    thought, answer = "", ""
    for part in client(srv).chat.completions.create(stream=True, **kwargs):
        if part.choices:
            thought += (part.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
            answer += part.choices[0].delta.content or ""
    return whole, thought, answer


@pytest.mark.parametrize("template,reply", [(THINKING, REPLY), (OPENED, REPLY.removeprefix("<think>\n"))])
def test_the_server_returns_thinking_as_reasoning_content(tool_bundle, template, reply):  # noqa: F811
    with running(tool_bundle) as (srv, gen):
        whole, thought, answer = _ask(srv, gen, template, reply)
        assert whole.message.model_extra["reasoning_content"] == "Two and two." == thought
        assert whole.message.content == "It is 4." == answer and whole.finish_reason == "stop"


def test_a_tool_call_after_thinking_and_the_split_turned_off(tool_bundle):  # noqa: F811
    tools_template = THINKING.replace("{% for m in messages %}", "{% if tools %}<tool_call> {{ tools | tojson }}\n"
                                      "{% endif %}{% for m in messages %}")
    with running(tool_bundle) as (srv, gen):
        whole, thought, answer = _ask(srv, gen, tools_template, "<think>Weather.</think>\n\n" + CALL, TOOLS)
        assert whole.finish_reason == "tool_calls" and whole.message.tool_calls[0].function.name == "get_weather"
        assert whole.message.model_extra["reasoning_content"] == "Weather." == thought
        assert whole.message.content is None and answer == ""
        assert json.loads(whole.message.tool_calls[0].function.arguments) == {"city": "Paris"}
    with running(tool_bundle, reasoning=False) as (srv, gen):
        whole, thought, answer = _ask(srv, gen, THINKING, REPLY)
        assert whole.message.content == REPLY == answer and thought == ""
        assert "reasoning_content" not in (whole.message.model_extra or {})


def test_specedge_chat_shows_thinking_apart_from_the_answer(tool_bundle, capsys):  # noqa: F811
    """The terminal conversation: the thinking (dimmed on a terminal), then the answer on its own line; the turn's
    reply keeps both (the template drops old thinking from the history, as Qwen3's does)."""
    from specedge.chat_repl import _reply
    from specedge.runtime import load

    gen = load(tool_bundle)
    gen.chat_template = THINKING
    messages = [{"role": "user", "content": "2 + 2?"}]
    script_target(gen, gen.tokenizer.encode(REPLY, add_special_tokens=False).ids, len(gen.encode_messages(messages)))
    result, _ = _reply(gen, messages, dict(max_new_tokens=60))
    assert result.text.startswith(REPLY)
    assert capsys.readouterr().out == "Two and two.\nIt is 4.\n"
    gen.close()


def test_thinking_edge_cases_a_reviewer_found(tool_bundle):  # noqa: F811
    """The assistant message as the client got it (reasoning_content included) goes back in; a reply cut off while
    thinking has no content; number and logit_bias abuse is a 400, not a 500."""
    import httpx

    from test_serve import assert_openai_error

    with running(tool_bundle) as (srv, gen):
        gen.chat_template = OPENED
        messages = [{"role": "user", "content": "2 + 2?"}]
        script_target(gen, gen.tokenizer.encode("a long thought", add_special_tokens=False).ids,
                      len(gen.encode_messages(messages)))
        cut = client(srv).chat.completions.create(model=MODEL, messages=messages, max_tokens=5, temperature=0)
        assert cut.choices[0].message.content is None and cut.choices[0].finish_reason == "length"
        assert cut.choices[0].message.model_extra["reasoning_content"] == "a lon"
        again = [*messages, cut.choices[0].message.model_dump(), {"role": "user", "content": "and 3 + 3?"}]
        client(srv).chat.completions.create(model=MODEL, messages=again, max_tokens=2, temperature=0)
        for body, param in [(b'{"model": "%s", "prompt": "x", "logit_bias": {"\\u00b2": 1}}', "logit_bias"),
                            (b'{"model": "%s", "prompt": "x", "presence_penalty": 1' + b"0" * 400 + b"}",
                             "presence_penalty")]:
            bad = httpx.post(srv.url + "/completions", content=body % MODEL.encode(), timeout=10)
            assert_openai_error(bad, 400, param)


JSON_REPLY = '{"a": 4}'
ANSWER = {"type": "json_schema", "json_schema": {"name": "a", "schema": {
    "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}}}


@pytest.mark.parametrize("template,reply,reasoning", [
    (OPENED, "Two and two.\n</think>\n\n" + JSON_REPLY, "Two and two."),          # the prompt opened the block
    (THINKING, "<think>\nTwo and two.\n</think>\n\n" + JSON_REPLY, "Two and two."),   # the reply opens it
    (THINKING, JSON_REPLY, None)], ids=["opened", "optional", "no-thought"])     # or answers at once
def test_a_grammar_holds_after_the_thinking(tool_bundle, template, reply, reasoning):  # noqa: F811
    """response_format on a thinking template: the reply thinks, then writes the schema's JSON (as vLLM applies a
    grammar after its reasoning parser's end); whole and streamed, under speculation."""
    with running(tool_bundle) as (srv, gen):
        gen.chat_template = template
        messages = [{"role": "user", "content": "2 + 2?"}]
        script_target(gen, gen.tokenizer.encode(reply, add_special_tokens=False).ids, len(gen.encode_messages(messages)))
        kwargs = dict(model=MODEL, messages=messages, max_tokens=120, temperature=0, response_format=ANSWER)
        whole = client(srv).chat.completions.create(**kwargs).choices[0]
        assert whole.finish_reason == "stop" and json.loads(whole.message.content) == {"a": 4}
        assert whole.message.model_extra["reasoning_content"] == reasoning
        thought, answer = "", ""
        for part in client(srv).chat.completions.create(stream=True, **kwargs):
            if part.choices:
                thought += (part.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
                answer += part.choices[0].delta.content or ""
        assert (thought or None, answer) == (reasoning, whole.message.content)


def test_a_thinking_reply_that_breaks_the_schema_after_it_is_held_to_it(tool_bundle):  # noqa: F811
    """The thought is free, the answer is not: a scripted answer outside the schema comes out as JSON the schema
    allows; without the reasoning parser (--no-reasoning-parser) the grammar holds from the first token."""
    messages = [{"role": "user", "content": "2 + 2?"}]
    reply = "<think>\nTwo and two.\n</think>\n\nfour"
    with running(tool_bundle) as (srv, gen):
        gen.chat_template = THINKING
        script_target(gen, gen.tokenizer.encode(reply, add_special_tokens=False).ids, len(gen.encode_messages(messages)))
        out = client(srv).chat.completions.create(model=MODEL, messages=messages, max_tokens=60, temperature=0,
                                                  response_format={"type": "json_object"}).choices[0]
        assert out.message.model_extra["reasoning_content"] == "Two and two."
        assert out.finish_reason == "length" or isinstance(json.loads(out.message.content), dict)
        assert not out.message.content or out.message.content.startswith("{")
    with running(tool_bundle, reasoning=False) as (srv, gen):
        gen.chat_template = OPENED
        out = client(srv).chat.completions.create(model=MODEL, messages=messages, max_tokens=60, temperature=0,
                                                  response_format={"type": "json_object"}).choices[0]
        assert out.message.content.startswith("{") and "reasoning_content" not in (out.message.model_extra or {})


def test_a_forced_tool_call_after_thinking(tool_bundle):  # noqa: F811
    tools_template = THINKING.replace("{% for m in messages %}", "{% if tools %}<tool_call> {{ tools | tojson }}\n"
                                      "{% endif %}{% for m in messages %}")
    call = '{"name":"get_weather","arguments":{"city":"Paris"}}'     # compact, as a forced call's grammar holds it
    with running(tool_bundle) as (srv, gen):
        gen.chat_template = tools_template
        messages = [{"role": "user", "content": "Weather in Paris?"}]
        script_target(gen, gen.tokenizer.encode("<think>Weather.</think>\n\n" + call, add_special_tokens=False).ids,
                      len(gen.encode_messages(messages, tools=TOOLS)))
        out = client(srv).chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=160,
                                                  temperature=0, tool_choice="required").choices[0]
        assert out.finish_reason == "tool_calls" and out.message.model_extra["reasoning_content"] == "Weather."
        assert json.loads(out.message.tool_calls[0].function.arguments) == {"city": "Paris"}


def test_the_python_api_thinks_before_a_grammar_on_a_thinking_template(tool_bundle):  # noqa: F811
    """chat / stream_chat / generate(chat=True) decide as the server does; `thinking` given (None included) wins;
    speculation gives the target's own output."""
    from specedge.errors import OptionError
    from specedge.runtime import load

    gen = load(tool_bundle)
    gen.chat_template = OPENED
    messages = [{"role": "user", "content": "2 + 2?"}]
    script_target(gen, gen.tokenizer.encode("Two.\n</think>\n\n" + JSON_REPLY, add_special_tokens=False).ids,
                  len(gen.encode_messages(messages)))
    options = dict(max_new_tokens=80, response_format=ANSWER)
    alone = gen.chat(messages, **options, policy="target")
    assert alone.text.startswith("Two.\n</think>") and json.loads(alone.text.split("</think>")[1]) == {"a": 4}
    assert gen.chat(messages, **options, policy="fixed:4").tokens == alone.tokens
    assert gen.generate("2 + 2?", chat=True, **options).tokens == alone.tokens
    held = gen.chat(messages, **options, thinking=None)                  # the grammar from the first token
    assert held.text.startswith("{")
    with pytest.raises(OptionError, match="thinking must be one of"):
        gen.chat(messages, **options, thinking="always")
    gen.close()


def test_think_tags_that_are_tokens_are_named_as_tokens_in_the_grammar():
    """Qwen3 holds <think> and </think> as added tokens, which the grammar library sees as special tokens: the grammar
    must name them (a text "</think>" would never match the model's token, so the thought could never end)."""
    from tokenizers import AddedToken
    from tiny_models import byte_tokenizer

    from specedge.runtime.grammar import GrammarTokens, grammar_of

    tok = byte_tokenizer(chat=True).backend_tokenizer
    tok.add_tokens([AddedToken("<think>", special=False), AddedToken("</think>", special=False)])
    eos = tok.token_to_id("<|im_end|>")
    vocab = GrammarTokens(tok.to_str(), tok.get_vocab_size(True), tok.get_vocab_size(True), {eos})

    def held(text: str, thinking: str, tags: tuple[bool, bool]) -> bool:
        constraint = vocab.constraint(grammar_of(ANSWER, thinking, tags), {eos})
        return all(constraint.push(t) for t in tok.encode(text, add_special_tokens=False).ids + [eos])

    thought = "<think>\nTwo </th and two.\n</think>\n\n" + JSON_REPLY
    assert held(thought, "optional", (True, True)) and held(JSON_REPLY, "optional", (True, True))
    assert held(thought.removeprefix("<think>"), "opened", (True, True))
    assert not held(thought, "optional", (False, False))        # as text, the tags' tokens are refused
    assert not held(thought + " ", "optional", (True, True))     # nothing after the JSON
    assert not held(thought.replace("\n\n{", "\n\n\n\n\n\n{"), "optional", (True, True))   # whitespace bounded
    assert not held(JSON_REPLY, "opened", (True, True))           # opened: the thought must close first


def test_a_think_end_token_lets_the_thought_end_on_the_model(tool_bundle):  # noqa: F811
    """The tiny model has one spare row: </think> becomes an added token there (id 259) while <think> stays text;
    each tag is named as what it is, and speculation gives the target's own reply."""
    from tokenizers import AddedToken

    from specedge.runtime import load

    gen = load(tool_bundle)
    gen.tokenizer.add_tokens([AddedToken("</think>", special=False)])
    assert gen.tokenizer.token_to_id("</think>") < gen.vocab_size and gen._think_tokens() == (False, True)
    messages = [{"role": "user", "content": "2 + 2?"}]
    for template, reply in [(OPENED, "Two.\n</think>\n\n" + JSON_REPLY), (THINKING, "<think>Two.</think>" + JSON_REPLY)]:
        gen.chat_template = template
        ids = gen.tokenizer.encode(reply, add_special_tokens=False).ids
        assert gen.tokenizer.token_to_id("</think>") in ids
        script_target(gen, ids, len(gen.encode_messages(messages)))
        alone = gen.chat(messages, max_new_tokens=60, response_format=ANSWER, policy="target")
        assert alone.tokens[:len(ids)] == ids and alone.stats.stop_reason == "eos"
        assert gen.chat(messages, max_new_tokens=60, response_format=ANSWER, policy="fixed:4").tokens == alone.tokens
    gen.close()
