"""The HTTP side: Starlette routes for the OpenAI-compatible API (completions, chat, responses), /health, /metrics
and the rejection analytics.

Every failure answers in OpenAI's error shape ({"error": {...}}) with its status; an unexpected exception is
logged here and answered as a bare 500 (no traceback reaches a client) and the server goes on. One log line
per request (logger "specedge.serve") when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import importlib.util
import json
import logging
import time

from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from specedge.errors import NoDraftModel, OptionError, SpecedgeError
from specedge.runtime.scheduler import QueueFull
from specedge.runtime.stats import GenerationStats
from specedge.runtime.reasoning import ReasoningStream
from specedge.runtime.tool_calls import ToolCallStream
from specedge.serve import protocol, responses
from specedge.serve.bridge import Bridge, RequestTimeout
from specedge.serve.errors import APIError, invalid
from specedge.serve.logprobs import (TextOffsets, TokenText, chat_logprobs, completion_logprobs, echoed_logprobs,
                                     joined)
from specedge.serve.metrics import Metrics
from specedge.serve.protocol import Limits
from specedge.serve.rejections import RejectionLog
from specedge.serve.response_store import ResponseStore
from specedge.serve.steps import StepLog
from specedge.serve.tokenize import detokenize, tokenize
from specedge.serve.tools import message_tool_calls

log = logging.getLogger("specedge.serve")
DEFAULT_MAX_BODY_BYTES = 1 << 20
RETRY_AFTER_S = 1
CLIENT_CLOSED = 499                    # nginx's status for "the client went away" (log only)


def _special_ids(gen) -> set[int]:
    ids = set(gen.eos_ids)
    try:
        ids |= {i for i, tok in gen.tokenizer.get_added_tokens_decoder().items() if tok.special}
    except AttributeError:                                      # older tokenizers
        pass
    return ids


class Service:
    """What the routes share: the generator, its bridge (made on the event loop at startup), metrics, analytics."""

    def __init__(self, gen, limits: Limits, api_key: str | None = None,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, replica: str | None = None):
        if not gen.scheduler.background:
            raise ValueError("serve needs a generator loaded with background=True")
        self.gen, self.limits, self.api_key, self.max_body_bytes = gen, limits, api_key, max_body_bytes
        self.replica = replica                      # set when several replicas share one route (Ray Serve)
        self.metrics = Metrics(gen.scheduler)
        self.rejections = RejectionLog(gen.decode, _special_ids(gen))
        self.steps = StepLog()
        self.token_text = TokenText(gen.tokenizer)
        self.bridge: Bridge | None = None
        self.created = int(time.time())
        self._previous_hook = None
        self._hook_failed = False
        self.active: set = set()                    # requests in flight (bridge.Request)
        self.stored = ResponseStore(limits.stored_responses)     # the Responses API's kept responses
        self._unstarted: set = set()                # streamed requests whose body has not started

    def cancel_all(self, reason: str = "shutdown") -> int:
        """Cancels every request in flight (the drain time is over) -> how many; each ends with a 503 error."""
        active = list(self.active)
        for handle in active:
            handle.cancel(reason)
        return len(active)

    def on_step(self, record) -> None:
        """Runs on the worker thread after every decode step: it must never raise (the step's rows would fail)."""
        try:
            self.metrics.observe_step(record)
            self.rejections.observe_step(record)
            self.steps.observe_step(record)
        except Exception:  # noqa: BLE001
            if not self._hook_failed:
                self._hook_failed = True
                log.exception("metrics hook failed (reported once)")

    @contextlib.asynccontextmanager
    async def lifespan(self, app):
        self.bridge = Bridge(self.gen, asyncio.get_running_loop())
        if importlib.util.find_spec("llguidance") is not None:     # response_format's vocabulary, off the loop
            try:
                await asyncio.to_thread(self.gen.grammar_tokens)
            except OptionError as err:                              # requests asking for it get a 400 saying so
                log.warning("response_format will be refused: %s", err)
        self._previous_hook, self.gen.scheduler.on_step = self.gen.scheduler.on_step, self.on_step
        try:
            yield
        finally:
            self.gen.scheduler.on_step = self._previous_hook

    # -- plumbing ------------------------------------------------------------------------------------
    def _authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise APIError(401, "Incorrect or missing API key: send 'Authorization: Bearer KEY'", None,
                           "invalid_api_key")

    async def _read_json(self, request: Request):
        limit = self.max_body_bytes
        length = request.headers.get("content-length")
        too_big = APIError(413, f"the request body exceeds the server's limit of {limit} bytes", None,
                           "request_too_large")
        if length is not None and (not length.isdigit() or int(length) > limit):
            raise too_big
        chunks, size = [], 0
        try:
            async for part in request.stream():
                size += len(part)
                if size > limit:
                    raise too_big
                chunks.append(part)
        except ClientDisconnect:                         # gone before its body arrived: not the server's fault
            raise APIError(CLIENT_CLOSED, "the client closed the connection before its request body arrived",
                           None, "client_disconnected") from None
        try:
            return json.loads(b"".join(chunks))
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise invalid("the request body is not valid JSON") from None

    def _error(self, request: Request, err: APIError, started: float) -> JSONResponse:
        if err.status != CLIENT_CLOSED:                # a client that left is not an error (as mid-request ones)
            self.metrics.request_error(err.status)
        log.info("%s %s %s %d %s: %s (%.3fs)", _client(request), request.method, request.url.path, err.status,
                 err.code or err.type, err.message, time.perf_counter() - started)
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    def route(self, handler, auth: bool = True):
        async def endpoint(request: Request) -> Response:
            started = time.perf_counter()
            try:
                if auth:
                    self._authorize(request)
                return await handler(request, started)
            except APIError as err:
                return self._error(request, err, started)
            except Exception:  # noqa: BLE001 - never a traceback to the client, never a dead server
                log.exception("%s %s %s: internal error", _client(request), request.method, request.url.path)
                return self._error(request, APIError(500, "internal server error", type="server_error"), started)
        return endpoint

    # -- generation ----------------------------------------------------------------------------------
    def _open(self, req: protocol.ParsedRequest) -> list:
        """Submits the request's n choices -> their handles; if one cannot be submitted, none runs."""
        sched = self.gen.scheduler
        if req.n > 1:
            room = sched.max_batch + sched.max_queue
            if req.n > room:
                raise invalid(f"'n' = {req.n} choices cannot all run here: the server holds at most {room} "
                              f"sequences (--max-batch {sched.max_batch} plus --max-queue {sched.max_queue})", "n")
            if sched.live() + req.n > room:                 # refused whole, before any choice is prefilled
                raise _busy(f"no room for {req.n} choices now; retry later")
        handles = []
        try:
            for index in range(req.n):
                handles.append(self._open_choice(req, index))
                self.active.add(handles[-1])
        except BaseException:
            self._cancel(handles)
            raise
        return handles

    def _open_choice(self, req: protocol.ParsedRequest, index: int):
        try:
            return self.bridge.open(req.prompt_ids, timeout=req.timeout, **protocol.choice_options(req, index))
        except QueueFull as err:
            raise _busy(str(err)) from None
        except NoDraftModel as err:
            ngram = '"speculation": {"policy": "adaptive", "drafter": "ngram"}'
            raise invalid(err.worded('"speculation": "off"', ngram),
                          "speculation") from None
        except OptionError as err:
            text = str(err)
            param = ("speculation.drafter" if "drafter" in text else
                     "speculation" if "polic" in text or "draft" in text else None)
            raise invalid(text, param) from None
        except SpecedgeError as err:
            if "closed" in str(err):
                raise APIError(503, "the server is shutting down", None, "shutting_down") from None
            raise invalid(str(err)) from None

    async def generate(self, request: Request, started: float, kind: str) -> Response:
        body = await self._read_json(request)
        req = protocol.parse(body, kind, self.gen, self.limits)
        handles = self._open(req)
        if req.stream:
            self._unstarted.update(handles)
            return StreamingResponse(self._sse(request, req, handles, started), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                                     background=BackgroundTask(self._release, request, req, handles, started))
        outcomes = await self._run_to_end(request, req, handles, started)
        if outcomes is None:
            return Response(status_code=CLIENT_CLOSED)
        stop = outcomes[0]["stop"]
        spec = protocol.speculation(_combined(outcomes), req.speculation, stop)
        for handle, outcome in zip(handles, outcomes):
            self._done(req, handle, outcome["stop"], outcome["stats"], started)
        self._log(request, req, handles, 200, stop, spec, started)
        choices = [self._choice(req, handle, outcome["stop"]) for handle, outcome in zip(handles, outcomes)]
        completion_tokens = 0 if req.echo_only else sum(len(h.tokens) for h in handles)
        return JSONResponse(protocol.response(req, choices, completion_tokens,
                                              outcomes[0]["stats"].cached_prompt_tokens, spec))

    async def _run_to_end(self, request: Request, req, handles: list, started: float) -> list[dict] | None:
        """Waits for every choice of an unstreamed request -> their outcomes (stop reason, stats); None where the
        client went away first (its slots freed, logged); raises the APIError a choice ended with."""
        outcomes: list[dict] = [{} for _ in handles]

        async def collect(handle, outcome):
            async for _ in self._follow(handle, outcome, alone=req.n == 1):
                pass

        async def collect_all():                     # a task (a bare gather future left cancelled logs an error)
            await asyncio.gather(*map(collect, handles, outcomes))

        waiter = asyncio.ensure_future(collect_all())
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({waiter, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not waiter.done():                    # the client went away (or we are cancelled): free the slots
                waiter.cancel()
                self._cancel(handles)
        if waiter.cancelled() or not waiter.done():
            self._log(request, req, handles, CLIENT_CLOSED, "cancelled", None, started)
            return None
        if waiter.exception() is not None:           # a failed or refused end: the other choices end too
            self._cancel(handles)
            raise waiter.exception()
        if _all_timed_out(handles, outcomes):
            raise _timed_out(req.timeout)
        return outcomes

    # -- the Responses API (serve/responses.py: its request and its shapes) -----------------------------
    async def responses(self, request: Request, started: float) -> Response:
        body = await self._read_json(request)
        try:
            chat, turns = responses.chat_body(body, self._earlier(body))
            req = protocol.parse(chat, "chat", self.gen, self.limits)
        except APIError as err:
            raise responses.renamed(err) from None
        if req.options.get("logprobs") is not None and (req.tools or req.thinking is not None):
            # the scores cover every token, and which of them a reasoning or call item's text took is not kept
            raise invalid(f"'{responses.LOGPROBS}' is served for replies without tools or a thinking template",
                          "include")
        shape = responses.Shape(body, req, turns, keep=body.get("store") is not False and self.stored.capacity > 0)
        handles = self._open(req)
        if req.stream:
            self._unstarted.update(handles)
            return StreamingResponse(self._response_events(request, req, handles[0], shape, started),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                                     background=BackgroundTask(self._release, request, req, handles, started))
        outcomes = await self._run_to_end(request, req, handles, started)
        if outcomes is None:
            return Response(status_code=CLIENT_CLOSED)
        handle, stop, stats = handles[0], outcomes[0]["stop"], outcomes[0]["stats"]
        spec = protocol.speculation(stats, req.speculation, stop)
        self._done(req, handle, stop, stats, started)
        self._log(request, req, handles, 200, stop, spec, started)
        thought, text, calls = protocol.reply_parts(req, handle.text)
        status = "completed" if calls else responses.status(stop)
        scores = self._response_logprobs(req, handle.logprobs)
        final = shape.response(status, shape.output(thought, text, calls, status, scores),
                               self._response_usage(req, handle, stats, thought), stop, spec)
        self._keep(shape, final, text, calls)
        return JSONResponse(final)

    def _earlier(self, body) -> list[dict]:
        """The stored conversation `previous_response_id` continues ([] without one); a 400 for one not kept."""
        previous = body.get("previous_response_id") if isinstance(body, dict) else None
        if previous is None:
            return []
        if not isinstance(previous, str):
            raise invalid("'previous_response_id' must be a string", "previous_response_id")
        turns = self.stored.turns(previous)
        if turns is None:
            raise invalid(f"Previous response with id '{previous}' not found (this server keeps its newest "
                          f"{self.stored.capacity} responses in memory, unless they were sent with store false)",
                          "previous_response_id", "previous_response_not_found")
        return turns

    def _keep(self, shape, final: dict, text: str, calls: list[dict]) -> None:
        """Stores a finished response (unless it was sent with store false) for a next previous_response_id."""
        if final["store"]:                       # kept without logprobs: 20 alternatives a token add up to MiBs
            self.stored.save(final["id"], [*shape.turns, responses.reply_turn(text, calls)],
                             responses.without_logprobs(final))

    async def stored_response(self, request: Request, started: float) -> Response:
        responses.check_retrieve(request.query_params.multi_items())
        response_id = request.path_params["response_id"]
        final = self.stored.get(response_id)
        if final is None:
            raise APIError(404, f"No response with id '{response_id}' is kept here", "response_id", "not_found")
        if request.method == "DELETE":
            self.stored.delete(response_id)
            return JSONResponse({"id": response_id, "object": "response", "deleted": True})
        return JSONResponse(final)

    def _response_logprobs(self, req, entries: list) -> list | None:
        """The Responses API's logprobs of these tokens (chat's entries); None where they were not asked for."""
        return None if req.options.get("logprobs") is None else chat_logprobs(entries, self.token_text)["content"]

    def _response_usage(self, req, handle, stats, thought: str | None) -> dict:
        """The Responses usage; its reasoning tokens are the thinking's text tokenized again (the reply's own
        tokens are not told apart)."""
        thinking = len(self.gen.tokenizer.encode(thought, add_special_tokens=False).ids) if thought else 0
        return responses.usage(len(req.prompt_ids), len(handle.tokens), stats.cached_prompt_tokens,
                               min(thinking, len(handle.tokens)))

    async def _response_events(self, request: Request, req, handle, shape, started: float):
        self._unstarted.discard(handle)
        status, stop, spec, outcome = CLIENT_CLOSED, "cancelled", None, {}
        events = responses.Events(shape, logprobs=req.options.get("logprobs") is not None)
        pending: list = []                                     # scores of tokens whose text has not come out yet
        calls: list = []
        try:
            for event in events.start():
                yield event
            try:
                async for kind, text, entries in self._parts(req, handle, outcome):
                    out = []
                    if kind == "thought":
                        out = events.reasoning(text)
                    elif kind in ("text", "rest"):
                        pending += self._response_logprobs(req, entries or []) or []
                        if text:
                            out, pending = events.message(text, pending), []
                    elif kind == "calls" and text:
                        calls = message_tool_calls(req.id, text, req.one_tool_call)
                    for event in out:
                        await asyncio.sleep(0)             # the loop runs between events (see _sse)
                        yield event
            except APIError as err:                         # headers are sent: an error event, then the end
                self._cancel([handle])
                status, stop = err.status, err.code or err.type
                self.metrics.request_error(err.status)
                yield shape.event("error", code=err.code or err.type, message=err.message, param=err.param)
                yield shape.event("response.failed", response={**shape.response("failed", []),
                                                               "error": {"code": responses.failed_code(err.status),
                                                                         "message": err.message}})
                return
            tail = events.message("", pending) if pending else []   # scores whose text never came out
            stop, stats = outcome["stop"], outcome["stats"]
            self._done(req, handle, stop, stats, started)
            spec = protocol.speculation(stats, req.speculation, stop)
            finished = "completed" if calls else responses.status(stop)
            for event in tail + events.finish(calls, finished):
                yield event
            final = shape.response(finished, shape.output(events.thought, events.text, calls, finished,
                                                          events.logprobs),
                                   self._response_usage(req, handle, stats, events.thought), stop, spec)
            self._keep(shape, final, events.text, calls)
            status = 200
            yield shape.event(f"response.{final['status']}", response=final)
        finally:
            self._log(request, req, [handle], status, stop, spec, started)

    def _cancel(self, handles: list) -> None:
        for handle in handles:
            handle.cancel()
            self.active.discard(handle)

    def _choice(self, req, handle, stop: str) -> protocol.Choice:
        """A finished choice; echoed (completions' echo), its text starts with the prompt and its logprobs with the
        prompt's tokens."""
        offsets = TextOffsets(self.token_text)
        if not req.echo:
            return protocol.Choice(handle.text, stop, self._logprobs(req, handle.logprobs, offsets))
        text, block = self._echo_head(req, offsets, handle.result.prompt_logprobs if handle.result else None)
        if req.echo_only:
            return protocol.Choice(text, stop, block)
        rest = self._logprobs(req, handle.logprobs, offsets)
        return protocol.Choice(text + handle.text, stop, _then(block, rest))

    def _echo_head(self, req, offsets: TextOffsets, scores) -> tuple[str, dict | None]:
        """An echoed choice's start: the prompt's text and, where logprobs were asked for, its legacy block (scores:
        the prompt's TokenLogprobs, None where they are not known)."""
        text = self.gen.tokenizer.decode(req.prompt_ids, skip_special_tokens=True)
        if req.options.get("logprobs") is None:
            return text, None
        return text, echoed_logprobs(req.prompt_ids, scores, offsets)

    def _logprobs(self, req, entries: list, offsets: TextOffsets) -> dict | None:
        """The logprobs block of these tokens in the request kind's shape; None where none were asked for.
        offsets: the response's text offsets so far (completions)."""
        if req.options.get("logprobs") is None:
            return None
        if req.kind == "chat":
            return chat_logprobs(entries, self.token_text)
        return completion_logprobs(entries, offsets)

    async def _follow(self, handle, outcome: dict, alone: bool = True):
        """Yields a request's (text piece, its tokens' logprobs or None) as they come (a piece may be empty when
        logprobs were asked for); at its end fills outcome (stop reason, stats), or raises APIError: 500 for a
        failed generation, 503 for a shutdown or a timeout before the first token; one of n choices (not `alone`),
        which may wait behind its siblings, ends empty at a timeout instead (the request: a 503 if all do)."""
        try:
            async for _, piece, ids, logprobs in handle.events():
                if ids:
                    self.metrics.tokens_out(len(ids))
                if piece or logprobs:
                    yield piece, logprobs
            stop, stats = handle.result.stats.stop_reason, handle.result.stats
        except RequestTimeout as err:
            result = await handle.settle()
            if not handle.tokens and alone:
                raise _timed_out(err.seconds) from None
            stop, stats = "timeout", result.stats if result else GenerationStats()
        except SpecedgeError as err:
            raise APIError(500, str(err), type="server_error", code="generation_failed") from None
        finally:
            self.active.discard(handle)
        if stop == "cancelled" and handle.cancelled_by == "shutdown":
            raise APIError(503, "the server is shutting down; the request was cancelled", None, "shutting_down")
        outcome.update(stop=stop, stats=stats)

    async def _release(self, request: Request, req, handles: list, started: float) -> None:
        """After a streamed response, however it ended: a stream whose body never started (the client left at
        once) still holds its sequences; cancel them."""
        for handle in handles:
            self.active.discard(handle)
            if handle.result is None:
                handle.cancel()
        if any(handle in self._unstarted for handle in handles):
            self._unstarted.difference_update(handles)
            self._log(request, req, handles, CLIENT_CLOSED, "cancelled", None, started)

    async def _choice_chunks(self, req, handle, index: int, outcome: dict, started: float):
        """One choice's stream chunks, its finish chunk last; fills outcome (stop, stats) before that one, or raises
        APIError (_follow)."""
        if req.kind == "chat":
            yield protocol.chunk(req, "", first=True, index=index)
        offsets = TextOffsets(self.token_text)           # completions' text_offset, carried from chunk to chunk
        echo, calls = req.echo, []
        async for kind, text, logprobs in self._parts(req, handle, outcome):
            if kind == "thought":
                yield protocol.chunk(req, None, reasoning=text, index=index)
            elif kind == "text" and not req.echo_only and (text or logprobs):   # echo only: the token is left out
                # completions' echo: the prompt comes with the first chunk (as vLLM's); its scores are all there
                # once a token is committed
                head, block = self._echo_head(req, offsets, handle.stream.scored_prompt()) if echo else ("", None)
                echo, block = False, _then(block, self._logprobs(req, logprobs or [], offsets))
                yield protocol.chunk(req, head + text, logprobs=block, index=index)
            elif kind == "end":
                self._done(req, handle, outcome["stop"], outcome["stats"], started)   # before the client sees the end
                if echo:                                     # nothing came before the end (echo with max_tokens 0)
                    head, block = self._echo_head(req, offsets,
                                                  handle.result.prompt_logprobs if handle.result else None)
                    yield protocol.chunk(req, head, logprobs=block, index=index)
            elif kind == "rest":
                yield protocol.chunk(req, text, index=index)
            elif kind == "calls" and text:
                calls = text
                yield protocol.chunk(req, None, calls=calls, index=index)
        finish = "tool_calls" if calls else protocol.finish_reason(outcome["stop"])
        yield protocol.chunk(req, None, finish=finish, index=index)

    async def _parts(self, req, handle, outcome: dict):
        """A streamed reply split as the whole reply is (its thinking apart, tool calls held back until whole):
        ("thought", text, None), ("text", text, logprobs of its tokens or None) as tokens come; ("end", None, None)
        once generation ended (outcome filled, _follow); then what was held back: ("thought", ...), ("rest", text,
        None), and last ("calls", [ToolCall], None). Raises APIError as _follow does."""
        thinking = ReasoningStream(req.thinking) if req.thinking is not None else None   # <think> apart
        calling = ToolCallStream(req.tools) if req.tools else None       # holds a tool call back until it is whole
        async for piece, logprobs in self._follow(handle, outcome, alone=req.n == 1):
            thought, piece = thinking.feed(piece) if thinking else ("", piece)
            if thought:
                yield "thought", thought, None
            yield "text", calling.feed(piece) if calling else piece, logprobs
        yield "end", None, None
        thought, rest = thinking.finish() if thinking else ("", "")
        if thought:
            yield "thought", thought, None
        rest = calling.feed(rest) if calling else rest
        if rest:
            yield "rest", rest, None
        rest, calls = calling.finish() if calling else ("", [])
        if rest:
            yield "rest", rest, None
        yield "calls", calls, None

    async def _sse(self, request: Request, req, handles: list, started: float):
        self._unstarted.difference_update(handles)
        status, stop, spec, outcomes = CLIENT_CLOSED, "cancelled", None, [{} for _ in handles]
        try:
            streams = [self._choice_chunks(req, handle, index, outcome, started)
                       for index, (handle, outcome) in enumerate(zip(handles, outcomes))]
            finished, final, held = 0, None, []
            try:
                async with contextlib.aclosing(_merged(streams)) as events:
                    async for event in events:
                        choice = event["choices"][0]
                        if choice["finish_reason"] is not None:
                            finished += 1
                            if finished == len(handles):    # the last choice's end: the stats come with it
                                final = event
                                continue
                        if _ended_empty(handles[choice["index"]], outcomes[choice["index"]]):
                            held.append(event)              # its end (and echo's prompt): until it is known
                            continue                        # whether every choice did
                        # the loop runs between events: events queued while the client read slowly would
                        # otherwise go out in one burst, past a connection the loop has not yet seen close (asyncio
                        # logs each write after the fifth)
                        await asyncio.sleep(0)
                        yield _event(event)
                if _all_timed_out(handles, outcomes):     # as unstreamed: nothing came, so no choice is an answer
                    raise _timed_out(req.timeout)
                for event in held:
                    yield _event(event)
            except APIError as err:                       # headers are sent: an error event, then the end
                self._cancel(handles)
                status, stop = err.status, err.code or err.type
                self.metrics.request_error(err.status)
                yield _event(err.body())
                yield "data: [DONE]\n\n"
                return
            stop, status = outcomes[0]["stop"], 200
            spec = protocol.speculation(_combined(outcomes), req.speculation, stop)
            if req.include_usage:
                yield _event(final)
                final = protocol.usage_chunk(req, 0 if req.echo_only else sum(len(h.tokens) for h in handles),
                                             outcomes[0]["stats"].cached_prompt_tokens)
            final["speculation"] = spec                   # the stream's last chunk carries the stats
            yield _event(final)
            yield "data: [DONE]\n\n"
        finally:
            self._log(request, req, handles, status, stop, spec, started)

    def _done(self, req, handle, stop: str, stats, started: float) -> None:
        n = len(handle.tokens)
        ttft = handle.first_token_at - handle.arrived if handle.first_token_at else None
        tpot = (handle.token_times[-1] - handle.first_token_at) / (n - 1) if n > 1 and handle.first_token_at else None
        self.metrics.request_done(len(req.prompt_ids), stats.cached_prompt_tokens, n, protocol.finish_reason(stop),
                                  time.perf_counter() - handle.arrived, ttft, tpot)

    def _log(self, request, req, handles: list, status: int, stop: str, spec: dict | None, started: float) -> None:
        total = time.perf_counter() - started
        firsts = [h.first_token_at - h.arrived for h in handles if h.first_token_at]
        ttft = f"{min(firsts):.3f}s" if firsts else "-"
        n = sum(len(h.tokens) for h in handles)
        extra = f" n={len(handles)}" if len(handles) > 1 else ""
        if spec:
            extra += (f" drafted={spec['drafted_tokens']} accepted={spec['accepted_tokens']}"
                      f" acc_len={spec['mean_accepted_length']:.2f}")
        log.info("%s %s %s %d %s prompt=%d completion=%d finish=%s ttft=%s e2e=%.3fs tok/s=%.1f policy=%s%s%s",
                 _client(request), request.method, request.url.path, status, req.id, len(req.prompt_ids), n,
                 stop if status != CLIENT_CLOSED else "client_disconnected", ttft, total,
                 n / total if total > 0 else 0.0, req.speculation, extra, " stream" if req.stream else "")

    # -- the other endpoints ------------------------------------------------------------------------
    def _model_card(self) -> dict:
        return {"id": self.limits.model, "object": "model", "created": self.created, "owned_by": "specedge",
                "max_model_len": self.gen.max_seq_len}

    async def models(self, request: Request, started: float) -> Response:
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def model(self, request: Request, started: float) -> Response:
        name = request.path_params["model"]
        if name != self.limits.model:
            raise APIError(404, f"The model '{name}' does not exist; this server serves '{self.limits.model}'",
                           "model", "model_not_found")
        return JSONResponse(self._model_card())

    async def health(self, request: Request, started: float) -> Response:
        sched = self.gen.scheduler
        state = {"status": "ok", "model": self.limits.model, "running": len(sched.running),
                 "waiting": len(sched.waiting), "max_batch": sched.max_batch, "max_queue": sched.max_queue,
                 "prompt_cache": {"on": sched.cache.enabled, "texts": sched.cache.count()}}
        if self.replica is not None:
            state["replica"] = self.replica
        return JSONResponse(state)

    async def prometheus(self, request: Request, started: float) -> Response:
        return Response(self.metrics.render(), media_type=self.metrics.content_type)

    async def tokenize_view(self, request: Request, started: float) -> Response:
        return JSONResponse(tokenize(await self._read_json(request), self.gen, self.limits))

    async def detokenize_view(self, request: Request, started: float) -> Response:
        return JSONResponse(detokenize(await self._read_json(request), self.gen, self.limits))

    async def rejections_view(self, request: Request, started: float) -> Response:
        return JSONResponse(self.rejections.snapshot(top=_count(request, "top", 20, 10_000),
                                                     recent=_count(request, "recent", 50, 10_000)))

    async def steps_view(self, request: Request, started: float) -> Response:
        return JSONResponse(self.steps.snapshot(recent=_count(request, "recent", 100, self.steps.kept),
                                                after=_count(request, "after", 0, 2**62)))


def _count(request: Request, name: str, default: int, most: int) -> int:
    """A query parameter that must be an integer in 0 .. most (a 400 naming it otherwise)."""
    value = request.query_params.get(name, str(default))
    if not value.isdigit() or int(value) > most:
        raise invalid(f"'{name}' must be an integer between 0 and {most}", name)
    return int(value)


def _busy(why: str) -> APIError:
    return APIError(429, f"the server is busy: {why}", None, "queue_full", {"Retry-After": str(RETRY_AFTER_S)})


def _timed_out(seconds: float) -> APIError:
    return APIError(503, f"the request reached its timeout of {seconds:g} s before its first token",
                    None, "timeout", {"Retry-After": str(RETRY_AFTER_S)})


def _ended_empty(handle, outcome: dict) -> bool:
    """A choice that reached the timeout before its first token (one of n > 1: _follow raises that for n = 1)."""
    return outcome.get("stop") == "timeout" and not handle.tokens


def _all_timed_out(handles: list, outcomes: list[dict]) -> bool:
    return len(handles) > 1 and all(map(_ended_empty, handles, outcomes))


def _combined(outcomes: list[dict]):
    """The stats of every choice together (one choice: its own)."""
    stats = [outcome["stats"] for outcome in outcomes]
    return stats[0] if len(stats) == 1 else GenerationStats.combine(stats)


async def _merged(sources: list):
    """The items of several async iterators, as each comes (one iterator: itself, no task). An iterator's error
    ends it all; leaving early cancels every iterator still running."""
    if len(sources) == 1:
        async for item in sources[0]:
            yield item
        return
    queue: asyncio.Queue = asyncio.Queue()
    end = object()

    async def pump(source):
        try:
            async for item in source:
                await queue.put((item, None))
            await queue.put((end, None))
        except Exception as err:  # noqa: BLE001 - handed to the consumer, which raises it
            await queue.put((end, err))

    tasks = [asyncio.ensure_future(pump(source)) for source in sources]
    try:
        left = len(tasks)
        while left:
            item, err = await queue.get()
            if err is not None:
                raise err
            if item is end:
                left -= 1
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()


def _then(first: dict | None, second: dict | None) -> dict | None:
    """Two legacy logprobs blocks in order, either of which may be missing."""
    return joined(first, second) if first and second else first or second


def _client(request: Request) -> str:
    return f"{request.client.host}:{request.client.port}" if request.client else "-"


def _event(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _disconnected(request: Request) -> None:
    """Returns when the client closes the connection (the body has been read: receive() then waits for that)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class TrailingSlash:
    """ASGI middleware: /v1/models/ is /v1/models, as clients that build paths by joining strings send it (OpenAI's
    own API answers both; Starlette would answer a 307 redirect that clients do not all follow, with no body)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        path, raw = scope.get("path", ""), scope.get("raw_path")
        # a slash as sent, not an escaped %2F that ends a model id (raw_path is the path still percent-encoded)
        sent = raw.endswith(b"/") if raw else path.endswith("/")
        if scope["type"] == "http" and len(path) > 1 and path.endswith("/") and sent:
            scope = {**scope, "path": path.rstrip("/") or "/"}
            if raw:
                scope["raw_path"] = raw.rstrip(b"/") or b"/"
        await self.app(scope, receive, send)


class ReplicaHeader:
    """ASGI middleware: every response names the replica that made it (X-Specedge-Replica), so that a client
    behind a load balancer can tell which engine answered (and which /metrics to read)."""

    def __init__(self, app, replica: str):
        self.app, self.replica = app, replica

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def tagged(message):
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message).append("X-Specedge-Replica", self.replica)
            await send(message)

        await self.app(scope, receive, tagged)


def create_app(gen, limits: Limits, api_key: str | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, replica: str | None = None) -> Starlette:
    """The ASGI app for a generator loaded with background=True. replica: a name for this engine among several
    behind one route (Ray Serve), sent as the X-Specedge-Replica header and in /health."""
    service = Service(gen, limits, api_key, max_body_bytes, replica)

    async def completions(request, started):
        return await service.generate(request, started, "completion")

    async def chat(request, started):
        return await service.generate(request, started, "chat")

    async def not_found(request: Request, exc: HTTPException) -> Response:
        message = {404: f"no route {request.url.path}", 405: f"method {request.method} not allowed here"}
        err = APIError(exc.status_code, message.get(exc.status_code, str(exc.detail)), None,
                       {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code))
        return service._error(request, err, time.perf_counter())

    routes = [
        Route("/v1/completions", service.route(completions), methods=["POST"]),
        Route("/v1/chat/completions", service.route(chat), methods=["POST"]),
        Route("/v1/responses", service.route(service.responses), methods=["POST"]),
        Route("/v1/responses/{response_id}", service.route(service.stored_response), methods=["GET", "DELETE"]),
        Route("/v1/models", service.route(service.models), methods=["GET"]),
        Route("/v1/models/{model:path}", service.route(service.model), methods=["GET"]),
        Route("/v1/speculation/rejections", service.route(service.rejections_view), methods=["GET"]),
        Route("/v1/speculation/steps", service.route(service.steps_view), methods=["GET"]),
        Route("/tokenize", service.route(service.tokenize_view), methods=["POST"]),
        Route("/detokenize", service.route(service.detokenize_view), methods=["POST"]),
        Route("/health", service.route(service.health, auth=False), methods=["GET"]),
        Route("/metrics", service.route(service.prometheus, auth=False), methods=["GET"]),
    ]
    middleware = [Middleware(TrailingSlash)]
    middleware += [Middleware(ReplicaHeader, replica=replica)] if replica is not None else []
    app = Starlette(routes=routes, lifespan=service.lifespan, exception_handlers={HTTPException: not_found},
                    middleware=middleware)
    app.state.service = service
    return app
