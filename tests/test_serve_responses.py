"""POST /v1/responses through the official openai client: the same reply as chat completions, streamed as the
Responses API's typed events, reasoning as its own item, JSON output, and every parameter that cannot be honoured
refused in OpenAI's error shape."""

import json

import pytest

pytest.importorskip("starlette")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from serve_helpers import MODEL, running, script_target, serve_bundle, sse_events, wait_idle  # noqa: E402
from test_reasoning import REPLY, THINKING  # noqa: E402
from test_tool_calls import REPLY as CALLING, TOOLS, TOOLS_TEMPLATE, tool_bundle  # noqa: E402, F401
from test_serve import assert_openai_error, client  # noqa: E402

ASK = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "write a loop"}]


@pytest.fixture(scope="module")
def server(workdir):
    with running(serve_bundle(workdir), max_batch=4, max_queue=16) as (srv, gen):
        yield srv, gen


def _validated(raw: dict):
    """A response as the official client's own model reads it strictly (every required field, every literal)."""
    from openai.types.responses import Response

    return Response.model_validate(raw)


def _validated_events(lines) -> list:
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    adapter = TypeAdapter(ResponseStreamEvent)
    return [adapter.validate_python(event) for event in sse_events(lines)]


def test_responses_and_events_validate_against_the_official_models(server):
    srv, gen = server
    body = {"model": MODEL, "input": "write a loop", "max_output_tokens": 8, "temperature": 0,
            "parallel_tool_calls": None, "reasoning": {"effort": None}, "stream_options": None}
    raw = httpx.post(srv.url + "/responses", json=body, timeout=30).json()
    response = _validated(raw)
    assert response.status == "incomplete" and response.output[0].status == "incomplete"
    assert response.usage.input_tokens_details.cached_tokens >= 0 and response.parallel_tool_calls is True
    with httpx.stream("POST", srv.url + "/responses", timeout=30,
                      json={**body, "stream": True, "stream_options": {"include_obfuscation": True}}) as r:
        events = _validated_events(r.iter_lines())
    assert events[-1].type == "response.incomplete" and events[-1].response.output_text == response.output_text
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [item.status for item in done] == ["incomplete"]


def test_a_response_is_the_chat_completion_s_reply(server):
    srv, gen = server
    chat = client(srv).chat.completions.create(model=MODEL, messages=ASK, max_tokens=24, temperature=0,
                                               extra_body={"ignore_eos": True})
    response = client(srv).responses.create(model=MODEL, instructions="be brief", input="write a loop",
                                            max_output_tokens=24, temperature=0,
                                            extra_body={"ignore_eos": True, "speculation": {"policy": "fixed:4"}})
    assert response.output_text == chat.choices[0].message.content and response.object == "response"
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.input_tokens == chat.usage.prompt_tokens and response.usage.output_tokens == 24
    assert response.usage.total_tokens == chat.usage.prompt_tokens + 24
    assert [item.type for item in response.output] == ["message"] and response.output[0].role == "assistant"
    spec = response.model_extra["speculation"]
    assert spec["drafted_tokens"] > 0 and spec["mean_accepted_length"] >= 1
    # input as messages with typed parts gives the same prompt
    parts = client(srv).responses.create(model=MODEL, max_output_tokens=24, temperature=0,
                                         input=[{"role": "system", "content": [{"type": "input_text",
                                                                                "text": "be brief"}]},
                                                {"type": "message", "role": "user", "content": "write a loop"}],
                                         extra_body={"ignore_eos": True})
    assert parts.output_text == response.output_text and parts.usage.input_tokens == response.usage.input_tokens


def test_a_streamed_response_sends_the_typed_events_in_order(server):
    srv, gen = server
    kwargs = dict(model=MODEL, instructions="be brief", input="write a loop", max_output_tokens=30, temperature=0,
                  extra_body={"speculation": {"policy": "fixed:4"}})
    whole = client(srv).responses.create(**kwargs)
    events = list(client(srv).responses.create(stream=True, **kwargs))
    kinds = [event.type for event in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          f"response.{whole.status}"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [event.sequence_number for event in events] == list(range(1, len(events) + 1))
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert text == events[-4].text == whole.output_text
    final = events[-1].response
    assert final.output_text == whole.output_text and final.usage.output_tokens == whole.usage.output_tokens
    assert final.model_extra["speculation"]["drafted_tokens"] > 0


def test_logprobs_are_the_chat_completion_s_whole_and_streamed(server):
    srv, gen = server
    chat = client(srv).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "write a loop"}],
                                               max_tokens=12, temperature=0, logprobs=True, top_logprobs=2,
                                               extra_body={"ignore_eos": True})
    expected = [entry.model_dump() for entry in chat.choices[0].logprobs.content]
    body = {"model": MODEL, "input": "write a loop", "max_output_tokens": 12, "temperature": 0, "top_logprobs": 2,
            "ignore_eos": True, "include": ["message.output_text.logprobs"]}
    raw = httpx.post(srv.url + "/responses", timeout=30, json=body).json()
    response = _validated(raw)
    got = [entry.model_dump() for entry in response.output[0].content[0].logprobs]
    assert len(got) == 12 and all(len(entry["top_logprobs"]) == 2 for entry in got)
    assert got == expected
    with httpx.stream("POST", srv.url + "/responses", timeout=30, json={**body, "stream": True}) as r:
        events = _validated_events(r.iter_lines())
    deltas = [entry.model_dump() for e in events if e.type == "response.output_text.delta" for entry in e.logprobs]
    done = [e for e in events if e.type == "response.output_text.done"][0]
    assert [d["token"] for d in deltas] == [g["token"] for g in got] == [entry.token for entry in done.logprobs]
    assert [d["logprob"] for d in deltas] == [g["logprob"] for g in got]
    final = events[-1].response.output[0].content[0].logprobs
    assert [entry.model_dump() for entry in final] == got


def test_json_output_follows_the_schema(server):
    srv, gen = server
    pytest.importorskip("llguidance")
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    response = client(srv).responses.create(model=MODEL, input="a number", max_output_tokens=40, temperature=0,
                                            text={"format": {"type": "json_schema", "name": "number",
                                                             "schema": schema, "strict": True}})
    assert isinstance(json.loads(response.output_text)["n"], int)


def test_thinking_comes_as_a_reasoning_item(workdir):
    with running(serve_bundle(workdir)) as (srv, gen):
        gen.chat_template = THINKING
        prompt = len(gen.encode_messages([{"role": "user", "content": "2 + 2?"}]))
        script_target(gen, gen.tokenizer.encode(REPLY, add_special_tokens=False).ids, prompt)
        kwargs = dict(model=MODEL, input="2 + 2?", max_output_tokens=200, temperature=0)
        whole = client(srv).responses.create(**kwargs)
        assert [item.type for item in whole.output] == ["reasoning", "message"]
        assert whole.output[0].content[0].text == "Two and two." and whole.output_text == "It is 4."
        assert whole.status == "completed" and whole.incomplete_details is None
        events = list(client(srv).responses.create(stream=True, **kwargs))
        thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
        answer = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert (thought, answer) == ("Two and two.", "It is 4.")
        added = [(e.output_index, e.item.type) for e in events if e.type == "response.output_item.added"]
        assert added == [(0, "reasoning"), (1, "message")]
        assert [item.type for item in events[-1].response.output] == ["reasoning", "message"]
        assert 0 < whole.usage.output_tokens_details.reasoning_tokens < whole.usage.output_tokens
        # the next turn as the Agents SDK sends it: the reply's items (reasoning among them, nulls kept) back as input
        again = client(srv).responses.create(model=MODEL, max_output_tokens=8, temperature=0, input=[
            {"role": "user", "content": "2 + 2?", "phase": None},
            *[item.model_dump() for item in whole.output], {"role": "user", "content": "and 3 + 3?"}])
        assert again.status in ("completed", "incomplete")


@pytest.mark.parametrize("body,status,param", [
    ({"input": "x", "store": "yes"}, 400, "store"),
    ({"input": "x", "previous_response_id": "resp_1"}, 400, "previous_response_id"),
    ({"input": "x", "previous_response_id": 7}, 400, "previous_response_id"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
    ({"input": "x", "tools": [{"type": "function", "name": "f", "parameters": {}}]}, 400, "tools"),  # no format
    ({"input": "x", "tool_choice": "required"}, 400, "tool_choice"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, 400, "input[0].type"),
    ({"input": [{"role": "user", "content": "x", "audio": "y"}]}, 400, "input[0].audio"),
    ({"input": "x", "logprobs": True}, 400, "logprobs"),
    ({"input": "x", "include": ["reasoning.encrypted_content"]}, 400, "include"),
    ({"input": "x", "top_logprobs": 2}, 400, "top_logprobs"),
    ({"input": "x", "include": ["message.output_text.logprobs"], "top_logprobs": 21}, 400, "top_logprobs"),
    ({"input": "x", "stream": True, "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, 400, "input[0].arguments"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, 400,
     "input[0].content[0]"),
    ({"input": []}, 400, "input"),
    ({"input": "x", "max_output_tokens": 0}, 400, "max_output_tokens"),
    ({"input": "x", "max_output_tokens": 100000}, 400, "max_output_tokens"),
    ({"input": "x", "text": {"format": {"type": "xml"}}}, 400, "text.format"),
    ({"input": "x", "max_tokens": 5}, 400, "max_tokens"),
    ({"input": "x", "reasoning": {"effort": "high"}}, 400, "reasoning"),
    ({"input": "x", "model": "gpt-5"}, 404, "model"),
])
def test_what_cannot_be_honoured_is_refused_in_openai_s_shape(server, body, status, param):
    srv, gen = server
    response = httpx.post(srv.url + "/responses", json={"model": MODEL, **body}, timeout=30)
    err = assert_openai_error(response, status, param)
    assert "max_completion_tokens" not in err["message"]                # the chat API's names stay hidden
    assert wait_idle(srv)["running"] == 0


def test_function_tools_calls_and_their_results(tool_bundle):  # noqa: F811
    """Responses' flat function tools through a <tool_call> template: the call as a function_call item, whole and
    streamed; the call and its output sent back as input items give the chat API's next turn."""
    flat = [{"type": "function", **TOOLS[0]["function"]}]
    asked = [{"role": "user", "content": "What is the weather in Paris?"}]
    with running(tool_bundle) as (srv, gen):
        gen.chat_template = TOOLS_TEMPLATE
        script_target(gen, gen.tokenizer.encode(CALLING, add_special_tokens=False).ids,
                      len(gen.encode_messages(asked, tools=TOOLS)))
        kwargs = dict(model=MODEL, input=asked, tools=flat, max_output_tokens=120, temperature=0)
        whole = client(srv).responses.create(**kwargs)
        assert [item.type for item in whole.output] == ["message", "function_call"] and whole.status == "completed"
        call = whole.output[1]
        assert whole.output_text == "Let me look.\n" and call.name == "get_weather"
        assert json.loads(call.arguments) == {"city": "Paris"} and call.call_id.startswith("call_")
        events = list(client(srv).responses.create(stream=True, **kwargs))
        assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Let me look.\n"
        done = [e.item for e in events if e.type == "response.output_item.done"]
        assert [item.type for item in done] == ["message", "function_call"] and done[1].arguments == call.arguments
        assert [e.arguments for e in events if e.type == "response.function_call_arguments.done"] == [call.arguments]
        assert [item.type for item in events[-1].response.output] == ["message", "function_call"]
        with httpx.stream("POST", srv.url + "/responses", json={**kwargs, "stream": True}, timeout=30) as r:
            strict = _validated_events(r.iter_lines())
        assert [e.type for e in strict] == [e.type for e in events] and strict[-1].response.status == "completed"

        # the next turn: the reply's items and the call's output as input, as the chat API's messages
        follow = [*asked, {"role": "assistant", "content": "Let me look.\n",
                           "tool_calls": [{"id": call.call_id, "type": "function",
                                           "function": {"name": call.name, "arguments": call.arguments}}]},
                  {"role": "tool", "tool_call_id": call.call_id, "content": "sunny, 21 C"}]
        script_target(gen, gen.tokenizer.encode("It is sunny.", add_special_tokens=False).ids,
                      len(gen.encode_messages(follow, tools=TOOLS)))
        items = [*asked, *[item.model_dump(exclude_none=True) for item in whole.output],
                 {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}]
        again = client(srv).responses.create(model=MODEL, input=items, tools=flat, max_output_tokens=40,
                                             temperature=0)
        assert again.output_text == "It is sunny." and [item.type for item in again.output] == ["message"]
        refused = httpx.post(srv.url + "/responses", timeout=30, json={
            "model": MODEL, "input": "x", "tools": flat, "include": ["message.output_text.logprobs"]})
        assert_openai_error(refused, 400, "include")


def test_previous_response_id_continues_a_stored_conversation(server):
    """A response continued by id gets the prompt the whole conversation makes (its instructions not carried over,
    as OpenAI's); retrieve and delete through the official client; store false keeps nothing."""
    srv, gen = server
    c = client(srv)
    kwargs = dict(model=MODEL, max_output_tokens=10, temperature=0, extra_body={"ignore_eos": True})
    first = c.responses.create(instructions="be brief", input="write a loop", **kwargs)
    assert first.store is True and c.responses.retrieve(first.id).output_text == first.output_text
    follow = c.responses.create(previous_response_id=first.id, input="and a class", **kwargs)
    whole = c.responses.create(input=[{"role": "user", "content": "write a loop"},
                                      {"role": "assistant", "content": first.output_text},
                                      {"role": "user", "content": "and a class"}], **kwargs)
    assert follow.output_text == whole.output_text and follow.usage.input_tokens == whole.usage.input_tokens
    assert follow.previous_response_id == first.id
    # streamed responses are kept too, and a chain goes on
    events = list(c.responses.create(previous_response_id=follow.id, input="now a test", stream=True, **kwargs))
    third = events[-1].response
    chained = c.responses.create(previous_response_id=third.id, input="thanks", **kwargs)
    assert chained.usage.input_tokens > third.usage.input_tokens > follow.usage.input_tokens
    for query, param in (({"stream": "true"}, "stream"), ({"starting_after": "3"}, "starting_after"),
                         ({"include": "message.output_text.logprobs"}, "include"), ({"x": "1"}, "x")):
        assert_openai_error(httpx.get(f"{srv.url}/responses/{first.id}", params=query, timeout=30), 400, param)
    c.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError, match="not found"):         # as OpenAI: a 400
        c.responses.create(previous_response_id=first.id, input="x", **kwargs)
    unstored = c.responses.create(input="x", store=False, **kwargs)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(unstored.id)


def test_kept_responses_leave_logprobs_out_and_none_are_kept_at_zero(workdir):
    with running(serve_bundle(workdir), stored_responses=0) as (srv, gen):
        r = client(srv).responses.create(model=MODEL, input="x", max_output_tokens=4)
        assert r.store is False
        with pytest.raises(openai.NotFoundError):
            client(srv).responses.retrieve(r.id)
    with running(serve_bundle(workdir)) as (srv, gen):
        r = client(srv).responses.create(model=MODEL, input="x", max_output_tokens=4, top_logprobs=3,
                                         include=["message.output_text.logprobs"])
        assert len(r.output[0].content[0].logprobs) == 4 and r.top_logprobs == 3
        kept = client(srv).responses.retrieve(r.id)
        assert kept.output_text == r.output_text and kept.output[0].content[0].logprobs is None


def test_the_store_keeps_the_newest(server):
    from specedge.serve.response_store import ResponseStore

    store = ResponseStore(capacity=2)
    for i in range(3):
        store.save(f"r{i}", [{"role": "user", "content": str(i)}], {"id": f"r{i}"})
    assert store.get("r0") is None and store.turns("r1") == [{"role": "user", "content": "1"}]
    store.save("r3", [], {"id": "r3"})                                  # r1 was used last: r2 goes
    assert store.get("r2") is None and store.get("r1") is not None and store.delete("r3") and not store.delete("r3")


def test_a_streamed_response_that_fails_ends_with_an_error_event(workdir):
    with running(serve_bundle(workdir), max_batch=1) as (srv, gen):
        def broken(*args, **kwargs):
            raise RuntimeError("boom")

        gen.target.run = broken
        with httpx.stream("POST", srv.url + "/responses", timeout=30,
                          json={"model": MODEL, "input": "x", "stream": True, "max_output_tokens": 4}) as r:
            events = sse_events(r.iter_lines())
        assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
        assert events[-2]["type"] == "error" and events[-2]["code"] == "generation_failed"
        assert events[-1]["type"] == "response.failed" and events[-1]["response"]["status"] == "failed"
        from openai.types.responses import ResponseFailedEvent
        assert ResponseFailedEvent.model_validate(events[-1]).response.error.code == "server_error"


def test_concurrent_streamed_responses_equal_their_solo_replies(server):
    """Eight streamed responses at once (the official async client): each gets its solo reply, whatever rows it
    shared calls with."""
    import asyncio

    srv, gen = server
    prompts = ["write a loop", "def f(x):", "class A:", "import os"]
    kwargs = dict(model=MODEL, max_output_tokens=20, temperature=0, extra_body={"ignore_eos": True})
    solo = {p: client(srv).responses.create(input=p, **kwargs).output_text for p in prompts}

    async def main():
        async_client = openai.AsyncOpenAI(base_url=srv.url, api_key="-", max_retries=0)

        async def one(prompt):
            text = ""
            async for event in await async_client.responses.create(input=prompt, stream=True, **kwargs):
                if event.type == "response.output_text.delta":
                    text += event.delta
            return prompt, text

        return await asyncio.gather(*(one(prompts[i % 4]) for i in range(8)))

    results = asyncio.run(asyncio.wait_for(main(), 90))
    assert len(results) == 8 and all(text == solo[prompt] for prompt, text in results)
    assert wait_idle(srv)["running"] == 0
