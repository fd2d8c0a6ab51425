"""Prometheus metrics: vLLM's speculative-decoding counters under a `specedge:` prefix, and what no peer exports.

Per decode step (from the scheduler's step records, on the worker thread): drafts (rows that drafted), draft
tokens, accepted tokens, both per draft position, the k chosen per step by batch size, steps with k = 0,
predicted vs realised accepted tokens (for steps whose policy predicts), draft calls. Per request (when it
ends): prompt and generation tokens, successes by finish reason, time to first token, time per output token,
end-to-end latency. At scrape time: requests running and waiting, the last step's batch size, output tokens/s
over the last 10 s. Each server has its own registry (several servers can live in one process, as in tests).
"""

from __future__ import annotations

import threading
import time
from collections import deque

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram,
                               disable_created_metrics, generate_latest)

disable_created_metrics()           # no *_created series (as vLLM): process-wide, and only the server imports this

P = "specedge:"
LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                   10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
RATE_WINDOW_S = 10.0


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, scheduler=None):
        self.registry = r = CollectorRegistry()
        # vLLM's names (vllm:spec_decode_*), counted the same way: a "draft" is one row's drafts in one step
        self.num_drafts = Counter(P + "spec_decode_num_drafts", "Rows that drafted (one per row per step with k > 0).",
                                  registry=r)
        self.num_draft_tokens = Counter(P + "spec_decode_num_draft_tokens", "Draft tokens proposed.", registry=r)
        self.num_accepted_tokens = Counter(P + "spec_decode_num_accepted_tokens", "Draft tokens accepted.", registry=r)
        self.accepted_per_pos = Counter(P + "spec_decode_num_accepted_tokens_per_pos",
                                        "Draft tokens accepted at each draft position (0-based).", ["position"],
                                        registry=r)
        self.drafted_per_pos = Counter(P + "spec_decode_num_draft_tokens_per_pos",
                                       "Draft tokens proposed at each draft position (0-based).", ["position"], registry=r)
        # what no peer exports
        self.steps = Counter(P + "decode_steps", "Decode steps, by the batch size and the k chosen (the step's largest).",
                             ["batch_size", "k"], registry=r)
        self.steps_k0 = Counter(P + "decode_steps_without_draft", "Decode steps with k = 0 (no draft call).", registry=r)
        self.draft_calls = Counter(P + "draft_calls", "Draft-model calls (one per draft position per step).", registry=r)
        self.predicted = Counter(P + "spec_decode_predicted_accepted_tokens",
                                 "Accepted tokens the policy predicted, in steps where it predicts.", registry=r)
        self.realised = Counter(P + "spec_decode_realised_accepted_tokens",
                                "Accepted tokens in the same steps (compare with the predicted counter).", registry=r)
        self.prompt_tokens = Counter(P + "prompt_tokens", "Prompt tokens of finished requests.", registry=r)
        self.cached_tokens = Counter(P + "prefix_cache_hits", "Of those, tokens the prompt cache held (not prefilled).",
                                     registry=r)
        self.generation_tokens = Counter(P + "generation_tokens", "Generated tokens of finished requests.", registry=r)
        self.success = Counter(P + "request_success", "Requests answered, by finish reason.", ["finished_reason"],
                               registry=r)
        self.errors = Counter(P + "request_errors", "Requests answered with an error, by HTTP status.", ["status"],
                              registry=r)
        self.ttft = Histogram(P + "time_to_first_token_seconds", "Time to first token (arrival to first commit).",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram(P + "time_per_output_token_seconds", "Per request: time per output token after the first.",
                              buckets=TPOT_BUCKETS, registry=r)
        self.e2e = Histogram(P + "e2e_request_latency_seconds", "End-to-end request latency.", buckets=LATENCY_BUCKETS,
                             registry=r)
        self.batch = Gauge(P + "batch_size", "Rows in the last decode step.", registry=r)
        self.tokens_per_s = Gauge(P + "generation_tokens_per_second",
                                  f"Output tokens per second over the last {RATE_WINDOW_S:g} s.", registry=r)
        self._window: deque[tuple[float, int]] = deque()
        self._lock = threading.Lock()
        self.tokens_per_s.set_function(self._rate)
        if scheduler is not None:
            running = Gauge(P + "num_requests_running", "Requests holding a KV slot.", registry=r)
            waiting = Gauge(P + "num_requests_waiting", "Requests queued for a slot.", registry=r)
            slots = Gauge(P + "kv_slots", "KV slots (--max-batch).", registry=r)
            texts = Gauge(P + "prompt_cache_texts", "Texts free KV slots hold for the prompt cache.", registry=r)
            texts.set_function(scheduler.cache.count)
            running.set_function(lambda: len(scheduler.running))
            waiting.set_function(lambda: len(scheduler.waiting))
            slots.set(scheduler.max_batch)

    # -- on the worker thread, once per decode step ------------------------------------------------
    def observe_step(self, record) -> None:
        k = max(record.k, default=0)
        self.steps.labels(str(record.batch), str(k)).inc()
        self.batch.set(record.batch)
        if k == 0:
            self.steps_k0.inc()
        self.draft_calls.inc(record.draft_calls)
        for drafted, accepted in zip(record.k, record.accepted):
            if not drafted:
                continue
            self.num_drafts.inc()
            self.num_draft_tokens.inc(drafted)
            self.num_accepted_tokens.inc(accepted)
            for pos in range(drafted):
                self.drafted_per_pos.labels(str(pos)).inc()
            for pos in range(accepted):
                self.accepted_per_pos.labels(str(pos)).inc()
        if record.predicted is not None:
            self.predicted.inc(record.predicted)
            self.realised.inc(sum(record.accepted))

    # -- on the event loop ------------------------------------------------------------------------
    def tokens_out(self, n: int) -> None:
        now = time.monotonic()
        with self._lock:
            self._prune(now)
            self._window.append((now, n))

    def _prune(self, now: float) -> None:
        while self._window and self._window[0][0] < now - RATE_WINDOW_S:
            self._window.popleft()

    def _rate(self) -> float:
        with self._lock:
            self._prune(time.monotonic())
            return sum(n for _, n in self._window) / RATE_WINDOW_S

    def request_done(self, prompt_tokens: int, cached_tokens: int, completion_tokens: int, finish_reason: str,
                     e2e_s: float, ttft_s: float | None, tpot_s: float | None) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self.cached_tokens.inc(cached_tokens)
        self.generation_tokens.inc(completion_tokens)
        self.success.labels(finish_reason).inc()
        self.e2e.observe(e2e_s)
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
        if tpot_s is not None:
            self.tpot.observe(tpot_s)

    def request_error(self, status: int) -> None:
        self.errors.labels(str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
