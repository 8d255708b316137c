"""The simulated engine: SGLang's scheduler loop with the GPU replaced by the timing model.

Each iteration picks one step the way SGLang's event loop does:

1. **Prefill first.** If the chunked request in progress or any waiting request can be
   admitted, build an extend batch: the waiting queue is ordered by ``fcfs`` (arrival) or
   ``lpm`` (longest cached prefix first; above 128 waiting requests SGLang falls back to
   fcfs, and so do we). A request is admitted while the running count stays under
   ``max_running_requests`` and the KV pool (free + evictable) covers its uncached tokens
   plus a reserve for its future output (``new_token_ratio`` of ``max_new_tokens``, decaying
   from 0.7 to 0.1 as decode steps go by, re-estimated after a retraction). The step's token budget
   is ``chunked_prefill_size``; a prompt that does not fit is cut, and its remainder is the
   first thing in the next extend batch; ``max_prefill_tokens`` bounds the new tokens of one
   batch (its first request always fits, as in SGLang). Requests whose prompt is complete get
   their first token at the end of the step.
2. **Otherwise decode.** Every running request gets one token. If the pool cannot hold one
   more token per request even after evicting unlocked cache leaves, requests are *retracted*
   (fewest output tokens first, as SGLang picks them) and go to the back of the queue keeping
   their output (the reserve ratio becomes SGLang's post-retraction estimate); as in SGLang, the KV the radix tree does not hold (the decoded tokens)
   is freed, so re-admission finds the prompt in the cache (unless evicted meanwhile) and
   recomputes the output so far.

KV accounting: ``used = radix.total_size + Σ private tokens of running requests``, where
private tokens are those not (yet) in the tree. Prompts enter the tree as soon as they are
prefilled (each chunk too), whole requests when they finish.

Time: :meth:`SimEngine.plan` returns a step with its simulated duration; :meth:`complete`
applies it at a given simulated time. :meth:`run` drives that in real time (dividing by
``time_scale``, with jitter and fault slowdown); the calibration bench drives the same two
methods on a virtual clock.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from . import timing, tokenizer
from .config import SimConfig
from .faults import Faults
from .metrics import SimMetrics
from .radix import RadixCache, RadixNode

INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = 0.1
NEW_TOKEN_RATIO_DECAY = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600
RESERVE_CLIP = 4096  # SGLang clips the per-request output reserve the same way
RETRACT_DECODE_STEPS = 20  # SGLang's retract_decode_steps: headroom in its post-retraction ratio
LPM_FALLBACK_QUEUE = 128
GEN_THROUGHPUT_INTERVAL = 40  # decode steps between throughput samples (SGLang's log interval)
CRASH_EXIT_CODE = 70


@dataclass
class LagStats:
    """How far the real-time driver trails its own schedule: the simulator's efficiency."""

    steps: int = 0
    late_steps: int = 0  # finished more than 20% of their own duration (and 2 ms) late
    total_lag_s: float = 0.0
    max_lag_s: float = 0.0
    busy_s: float = 0.0  # scheduled (wall) time of all steps

    def record(self, lag: float, step_wall: float) -> None:
        lag = max(0.0, lag)
        self.steps += 1
        self.total_lag_s += lag
        self.max_lag_s = max(self.max_lag_s, lag)
        self.busy_s += step_wall
        if lag > max(0.002, 0.2 * step_wall):
            self.late_steps += 1

    def as_dict(self) -> dict:
        return {
            "steps": self.steps,
            "late_steps": self.late_steps,
            "mean_lag_ms": 1000 * self.total_lag_s / self.steps if self.steps else 0.0,
            "max_lag_ms": 1000 * self.max_lag_s,
            "busy_s": self.busy_s,
        }


class RequestError(ValueError):
    """A request SGLang would reject before scheduling it (400 unless ``status`` says otherwise)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(eq=False)
class SimRequest:
    rid: str
    prompt_ids: list[int]
    max_new_tokens: int
    arrival: float
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    natural_length: int = 1 << 30
    stream: tokenizer.OutputStream | None = None
    output_ids: list[int] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)  # output text per token (joined lazily)
    text_cut: int | None = None  # where a matched stop string starts in the joined text
    finish_reason: dict | None = None
    cached_tokens: int = 0
    prefilled: int = 0  # tokens of self.tokens() whose KV exists (in tree or private)
    in_tree: int = 0  # tokens of self.tokens() covered by the locked radix path
    node: RadixNode | None = None
    admitted_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    aborted: bool = False
    abort_message: str = "Client disconnected"
    log_metrics: bool = True  # False for health probes (SGLang sends them with log_metrics=False)
    forced: list[str] | None = None  # constrained output: these pieces, then EOS (structured.py)
    priority: int = 0
    event: asyncio.Event = field(default_factory=asyncio.Event)
    # Called synchronously at every new token and at the end; the HTTP layer writes the
    # stream's next event from here, with no coroutine wake-up per token. Without a
    # listener, ``event`` is set instead.
    listener: Callable[[SimRequest], None] | None = None

    def tokens(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def text(self) -> str:
        text = "".join(self.pieces)
        return text if self.text_cut is None else text[: self.text_cut]

    def private_tokens(self) -> int:
        return self.prefilled - self.in_tree


@dataclass
class Step:
    kind: str  # "prefill" | "decode"
    duration: float  # simulated seconds, before jitter/slowdown
    chunks: list[tuple[SimRequest, int]] = field(default_factory=list)  # prefill: (req, new tokens)
    batch: list[SimRequest] = field(default_factory=list)  # decode


class SimEngine:
    def __init__(self, config: SimConfig, clock: Callable[[], float] | None = None, faults: Faults | None = None):
        self.config = config
        self.model = config.model
        self.gpu = config.gpu
        self.faults = faults or Faults()
        self.metrics = SimMetrics(config.served_model_name)
        self.capacity = config.max_total_tokens
        self.radix = RadixCache(config.page_size, enabled=not config.disable_radix_cache)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.chunked: SimRequest | None = None
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.rng = random.Random(config.seed)
        self._clock = clock or self._scaled_clock
        self._t0 = time.monotonic()
        self._wake = asyncio.Event()
        self._ids = itertools.count()
        self.last_gen_throughput = 0.0
        self.last_cache_hit_rate = 0.0
        self._tp_window: tuple[float, int] = (0.0, 0)
        self._decode_steps = 0
        self.crash_requested = False
        self.tokens_out = 0
        self.retractions = 0
        self.preemptions = 0  # running requests put back for a more important one (priority preemption)
        self.retracted_last_step = 0  # SGLang's num_retracted_reqs gauge: retracted by the last decode step
        self.lag = LagStats()
        # Progress: bumped by every step that produced output. /health_generate waits on it, the way
        # SGLang's health check waits for any output the tokenizer manager receives.
        self.progress = 0
        self._progress_waiters: list[asyncio.Future] = []

    # -- clock -------------------------------------------------------------------------------
    def _scaled_clock(self) -> float:
        """Simulated seconds since start: wall time multiplied by the time scale."""
        return (time.monotonic() - self._t0) * self.config.time_scale

    def now(self) -> float:
        return self._clock()

    # -- request intake ----------------------------------------------------------------------
    def new_request(
        self,
        prompt_ids: list[int],
        max_new_tokens: int | None,
        stop: tuple[str, ...] = (),
        stop_token_ids: frozenset[int] = frozenset(),
        ignore_eos: bool = False,
        rid: str | None = None,
        request_seed: int | None = None,
        priority: int | None = None,
        log_metrics: bool = True,
        forced: list[str] | None = None,
    ) -> SimRequest:
        """Validate like SGLang's tokenizer manager and queue the request. ``forced``: the output
        text pieces a grammar allows (``structured.Constraint``), then end of sequence."""
        context = self.config.context_length
        if not prompt_ids:
            raise RequestError("The input is empty.")
        if len(prompt_ids) >= context:
            raise RequestError(
                f"The input ({len(prompt_ids)} tokens) is longer than the model's context length ({context} tokens)."
            )
        if max_new_tokens is not None and max_new_tokens < 0:
            raise RequestError("max_new_tokens must be at least 0, got " + str(max_new_tokens) + ".")
        limit = context - len(prompt_ids)
        if max_new_tokens is not None and len(prompt_ids) + max_new_tokens > context:
            raise RequestError(
                f"Requested token count exceeds the model's maximum context length of {context} tokens. "
                f"You requested a total of {len(prompt_ids) + max_new_tokens} tokens: {len(prompt_ids)} tokens "
                f"from the input messages and {max_new_tokens} tokens for the completion. Please reduce the "
                "number of tokens in the input messages or the completion to fit within the limit."
            )
        if len(prompt_ids) + 1 > self.capacity:
            raise RequestError(f"The input ({len(prompt_ids)} tokens) does not fit the KV cache ({self.capacity}).")
        limit_q = self.config.max_queued_requests
        if limit_q is not None and log_metrics and len(self.waiting) >= limit_q:
            # SGLang's scheduler aborts a request past --max-queued-requests with 503.
            raise RequestError("The request queue is full.", status=503)
        stream = tokenizer.OutputStream(self.config.seed, prompt_ids, request_seed)
        natural = stream.natural_length(self.config.eos_min_tokens, self.config.eos_max_tokens)
        req = SimRequest(
            rid=rid or f"{next(self._ids):x}{os.getpid():x}{self.rng.getrandbits(64):016x}",
            prompt_ids=list(prompt_ids),
            max_new_tokens=limit if max_new_tokens is None else max_new_tokens,
            arrival=self.now(),
            stop=stop,
            stop_token_ids=stop_token_ids,
            ignore_eos=ignore_eos,
            natural_length=natural,
            stream=stream,
            log_metrics=log_metrics,
            priority=priority if priority is not None and self.config.enable_priority_scheduling else 0,
            forced=forced,
        )
        if log_metrics:
            self.metrics.num_requests += 1
        self.waiting.append(req)
        self._wake.set()
        return req

    def abort(self, req: SimRequest, message: str = "Client disconnected") -> None:
        """Client went away (or ``/abort_request``): stop spending (simulated) GPU time on it."""
        if req.done:
            return
        req.aborted = True
        req.abort_message = message
        if req in self.waiting:
            self.waiting.remove(req)
            self._finish(req, {"type": "abort", "message": message}, self.now())
        # A running or chunked request is reaped at the next step boundary (the GPU cannot
        # stop a kernel half-way either).
        self._wake.set()

    def abort_rid(self, rid: str = "", abort_all: bool = False) -> int:
        """SGLang's AbortReq: every request whose rid starts with ``rid`` (or all of them). A queued
        one finishes with "Abort in waiting queue" (SGLang's message); a running one at the next step."""
        if not rid and not abort_all:
            return 0  # SGLang ignores an empty rid without abort_all (it would match everything)
        live = [*self.waiting, *self.running, *([self.chunked] if self.chunked else [])]
        hits = [r for r in live if r.log_metrics and (abort_all or r.rid.startswith(rid))]
        for req in hits:
            queued = req in self.waiting
            self.abort(req, "Abort in waiting queue" if queued else "Abort request")
        return len(hits)

    # -- KV accounting -----------------------------------------------------------------------
    def used_tokens(self) -> int:
        return self.radix.total_size + sum(r.private_tokens() for r in self.running) + (
            self.chunked.private_tokens() if self.chunked and self.chunked not in self.running else 0
        )

    def free_tokens(self) -> int:
        return self.capacity - self.used_tokens()

    def _reserved_for_running(self) -> float:
        return sum(
            min(r.max_new_tokens - len(r.output_ids), RESERVE_CLIP) * self.new_token_ratio for r in self.running
        )

    def _ensure_free(self, tokens: float) -> bool:
        missing = math.ceil(tokens - self.free_tokens())
        if missing > 0:
            self.radix.evict(missing)
        return self.free_tokens() >= tokens

    def _attach(self, req: SimRequest, covered: int) -> None:
        """Move the request's lock to the tree path covering its first ``covered`` tokens."""
        added, node = self.radix.insert(req.tokens()[:covered])
        del added  # duplicates of tokens already cached are simply freed, as in SGLang
        self.radix.lock(node)
        if req.node is not None:
            self.radix.unlock(req.node)
        req.node = node
        req.in_tree = covered - covered % self.radix.page_size if self.radix.enabled else 0

    def _release(self, req: SimRequest, cache: bool = True) -> None:
        """Request leaves the GPU: cache what it computed (unless ``cache`` is off: a retraction
        frees the KV the tree does not hold yet, i.e. the decoded tokens), drop its lock."""
        if req.prefilled and cache:
            self._attach(req, req.prefilled)
        if req.node is not None:
            self.radix.unlock(req.node)
            req.node = None
        req.prefilled = req.in_tree = 0

    # -- planning ----------------------------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.chunked)

    def plan(self) -> Step | None:
        self._reap_aborted()
        step = self._plan_prefill()
        if step is not None:
            return step
        if self.running:
            return self._plan_decode()
        return None

    # -- progress ----------------------------------------------------------------------------
    def wait_progress(self) -> asyncio.Future:
        """A future resolved by the next step that produces output (any request's token)."""
        future = asyncio.get_running_loop().create_future()
        self._progress_waiters.append(future)
        return future

    def _made_progress(self) -> None:
        self.progress += 1
        waiters, self._progress_waiters = self._progress_waiters, []
        for future in waiters:
            if not future.done():
                future.set_result(self.progress)

    def _ordered_waiting(self) -> list[SimRequest]:
        queue = list(self.waiting)
        if self.config.enable_priority_scheduling:
            # SGLang: larger values first unless --schedule-low-priority-values-first; stable within a value.
            sign = 1 if self.config.schedule_low_priority_values_first else -1
            queue.sort(key=lambda r: sign * r.priority)
        if self.config.schedule_policy == "lpm" and self.radix.enabled and len(queue) <= LPM_FALLBACK_QUEUE:
            prefix = {id(r): self.radix.match_prefix(r.tokens())[0] for r in queue}
            queue.sort(key=lambda r: -prefix[id(r)])  # stable: ties keep arrival order
        return queue

    def _plan_prefill(self) -> Step | None:
        budget = self.config.chunked_prefill_size if self.config.chunked_prefill_size > 0 else 1 << 62
        chunks: list[tuple[SimRequest, int]] = []
        if self.chunked is not None:
            req = self.chunked
            remaining = len(req.tokens()) - req.prefilled
            take = min(remaining, budget)
            if not self._ensure_free(take):
                return None
            chunks.append((req, take))
            budget -= take
            if take < remaining:
                return self._prefill_step(chunks)
        if not self.waiting or budget <= 0:
            return self._prefill_step(chunks) if chunks else None
        reserve = self._reserved_for_running()
        slots = self.config.max_running_requests - len(self.running) - (1 if self.chunked else 0)
        for req in self._ordered_waiting():
            if slots <= 0 and self._preempt_for(req):
                slots += 1
            if slots <= 0 or budget <= 0:
                break
            tokens = req.tokens()
            matched, node = self.radix.match_prefix(tokens)
            if matched >= len(tokens):  # always compute at least the last token (for its logits)
                matched -= max(1, self.radix.page_size)
                matched, node = self.radix.match_prefix(tokens[: max(matched, 0)])
            uncached = len(tokens) - matched
            out_reserve = min(req.max_new_tokens - len(req.output_ids), RESERVE_CLIP) * self.new_token_ratio
            take = min(uncached, budget)
            if chunks and sum(t for _, t in chunks) + take > self.config.max_prefill_tokens:
                break  # SGLang's --max-prefill-tokens: a batch's input budget (its first request always fits)
            self.radix.lock(node)  # protect the matched prefix from the eviction just below
            need = take + (out_reserve if take == uncached else 0) + reserve
            if not self._ensure_free(need):
                self.radix.unlock(node)
                break
            self.waiting.remove(req)
            req.node, req.in_tree, req.prefilled = node, matched, matched
            if not req.output_ids:  # a retracted request keeps the hit it reported first
                req.cached_tokens = matched
            if req.admitted_at is None:
                req.admitted_at = self.now()
                if req.log_metrics:
                    self.metrics.queue.observe(req.admitted_at - req.arrival)
            chunks.append((req, take))
            budget -= take
            reserve += out_reserve
            slots -= 1
            if take < uncached:
                self.chunked = req
                break
        return self._prefill_step(chunks) if chunks else None

    def _preempt_for(self, req: SimRequest) -> bool:
        """SGLang's priority preemption (``PrefillAdder.preempt_to_schedule``): the batch is full and
        ``req`` outranks the least important running request by more than the threshold, so that one
        goes back to the queue (its KV beyond the cached prompt freed, its output kept and recomputed
        on re-admission) and ``req`` takes its place. Among equals the newest running request goes."""
        cfg = self.config
        if not cfg.enable_priority_scheduling or cfg.disable_priority_preemption or not self.running:
            return False
        sign = 1 if cfg.schedule_low_priority_values_first else -1  # sign x priority: higher is less important
        victim = max(self.running, key=lambda r: (sign * r.priority, r.arrival))
        if (req.priority - victim.priority) * -sign <= cfg.priority_scheduling_preemption_threshold:
            return False
        self.running.remove(victim)
        self._release(victim, cache=False)
        self.waiting.append(victim)
        self.preemptions += 1
        return True

    def _prefill_step(self, chunks: list[tuple[SimRequest, int]]) -> Step:
        duration = timing.prefill_batch_seconds(
            self.model, self.gpu, [(take, req.prefilled) for req, take in chunks], self.config.tp_size,
            self.config.quantization,
        )
        return Step("prefill", duration, chunks=chunks)

    def _plan_decode(self) -> Step:
        if not self._ensure_free(len(self.running)):
            self._retract(len(self.running))
        context = sum(len(r.prompt_ids) + len(r.output_ids) for r in self.running)
        duration = timing.decode_step_seconds(
            self.model, self.gpu, len(self.running), context, self.config.tp_size, self.config.quantization,
            self.config.kv_cache_dtype,
        )
        return Step("decode", duration, batch=list(self.running))

    def _retract(self, needed: int) -> None:
        """Out of KV mid-decode: send the youngest requests back to the queue, keeping output."""
        victims = sorted(self.running, key=lambda r: (len(r.output_ids), -len(r.prompt_ids)))
        retracted = 0
        while victims and len(self.running) > 1 and not self._ensure_free(len(self.running)):
            req = victims.pop(0)
            self.running.remove(req)
            # SGLang's retract_decode frees what the radix tree does not hold (the decoded tokens;
            # the prompt was inserted when it was prefilled): re-admission recomputes the output.
            self._release(req, cache=False)
            self.waiting.append(req)  # SGLang re-queues retracted requests at the back of the queue
            self.retractions += 1
            retracted += 1
        self.retracted_last_step = retracted
        # SGLang's post-retraction estimate: what the remaining batch has decoded, plus
        # retract_decode_steps tokens each, over what it may decode in all.
        decoded = sum(len(r.output_ids) for r in self.running)
        budget = sum(r.max_new_tokens for r in self.running)
        ratio = (decoded + RETRACT_DECODE_STEPS * len(self.running)) / budget if budget else 1.0
        self.new_token_ratio = min(1.0, ratio)
        del needed

    def _reap_aborted(self) -> None:
        for req in [r for r in self.running if r.aborted]:
            self.running.remove(req)
            self._release(req)
            self._finish(req, {"type": "abort", "message": req.abort_message}, self.now())
        if self.chunked is not None and self.chunked.aborted:
            req, self.chunked = self.chunked, None
            self._release(req)
            self._finish(req, {"type": "abort", "message": req.abort_message}, self.now())

    # -- applying a step ---------------------------------------------------------------------
    def complete(self, step: Step, now: float) -> None:
        produced = self.tokens_out
        if step.kind == "prefill":
            self._complete_prefill(step, now)
        else:
            self._complete_decode(step, now)
        if self.tokens_out != produced:
            self._made_progress()

    def _complete_prefill(self, step: Step, now: float) -> None:
        new_tokens = cached = 0
        for req, take in step.chunks:
            new_tokens += take
            if req.prefilled == req.in_tree:  # first chunk of this admission: its cache hit counts
                cached += req.prefilled
            req.prefilled += take
            if req.aborted:
                if self.chunked is req:
                    self.chunked = None
                self._release(req)
                self._finish(req, {"type": "abort", "message": req.abort_message}, now)
                continue
            self._attach(req, req.prefilled)
            if req.prefilled < len(req.tokens()):
                continue  # more chunks to come
            if self.chunked is req:
                self.chunked = None
            self.running.append(req)
            if not req.output_ids:  # a retracted request already streamed its first token
                if req.log_metrics:
                    self.metrics.prompt_tokens += len(req.prompt_ids)
                    self.metrics.cached_tokens += req.cached_tokens
                self._emit_token(req, now)
        total = new_tokens + cached
        self.last_cache_hit_rate = cached / total if total else 0.0

    def _complete_decode(self, step: Step, now: float) -> None:
        for req in step.batch:
            if req.done or req.aborted:
                continue
            req.prefilled += 1  # the KV of the previous token is written during this step
            self._emit_token(req, now)
        self._decode_steps += 1
        self.new_token_ratio = max(MIN_NEW_TOKEN_RATIO, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY)
        if self._decode_steps % GEN_THROUGHPUT_INTERVAL == 0:
            t0, n0 = self._tp_window
            if now > t0:
                self.last_gen_throughput = (self.metrics.generation_tokens - n0) / (now - t0)
            self._tp_window = (now, self.metrics.generation_tokens)

    def _emit_token(self, req: SimRequest, now: float) -> None:
        self.tokens_out += 1  # every output event, health probes included (progress for /health_generate)
        if req.max_new_tokens == 0:
            self._finish_running(req, {"type": "length", "length": 0}, now)
            return
        assert req.stream is not None
        if req.forced is not None:  # a grammar decides: its pieces, then the end of sequence
            index = len(req.output_ids)
            piece = req.forced[index] if index < len(req.forced) else ""
            token = tokenizer.piece_id(piece) if piece else tokenizer.EOS_TOKEN_ID
        else:
            hit_eos = not req.ignore_eos and len(req.output_ids) + 1 >= req.natural_length
            token = tokenizer.EOS_TOKEN_ID if hit_eos else req.stream.next_token()
            piece = tokenizer.token_text(token)
        req.output_ids.append(token)
        req.pieces.append(piece)
        if req.log_metrics:
            self.metrics.generation_tokens += 1
        if req.first_token_at is None:
            req.first_token_at = now
            if req.log_metrics:
                self.metrics.ttft.observe(now - req.arrival)
        elif req.log_metrics:
            self.metrics.itl.observe(now - (req.last_token_at or now))
        req.last_token_at = now
        reason = self._finish_reason(req, token, piece)
        if reason is not None:
            self._finish_running(req, reason, now)
        else:
            self._notify(req)
        limit = self.faults.crash_after_tokens
        if limit is not None and len(req.output_ids) >= limit:
            self.crash_requested = True

    @staticmethod
    def _notify(req: SimRequest) -> None:
        if req.listener is None:
            req.event.set()
            return
        try:
            req.listener(req)
        except Exception:  # one broken stream must not stop the scheduler
            logging.getLogger("nimbus.sim").exception("stream listener failed for %s", req.rid)

    def _finish_reason(self, req: SimRequest, token: int, piece: str) -> dict | None:
        if token == tokenizer.EOS_TOKEN_ID:
            return {"type": "stop", "matched": token}
        if token in req.stop_token_ids:
            return {"type": "stop", "matched": token}
        if req.stop:
            tail = "".join(req.pieces[-8:])
            for stop in req.stop:
                where = tail.find(stop)
                if where >= 0:
                    full = "".join(req.pieces)
                    req.text_cut = len(full) - len(tail) + where
                    return {"type": "stop", "matched": stop}
        if len(req.output_ids) >= req.max_new_tokens:
            return {"type": "length", "length": req.max_new_tokens}
        return None

    def _finish_running(self, req: SimRequest, reason: dict, now: float) -> None:
        if req in self.running:
            self.running.remove(req)
        self._release(req)
        self._finish(req, reason, now)

    def _finish(self, req: SimRequest, reason: dict, now: float) -> None:
        req.finish_reason = reason
        req.finished_at = now
        if req.log_metrics:
            if reason["type"] != "abort":
                self.metrics.e2e.observe(now - req.arrival)
            else:
                self.metrics.aborted += 1
        self._notify(req)

    # -- maintenance -------------------------------------------------------------------------
    def flush_cache(self) -> bool:
        if self.running or self.waiting or self.chunked:
            return False
        return self.radix.reset()

    def gauges(self) -> dict[str, tuple[str, float]]:
        self.metrics.retracted = self.retractions
        used = self.used_tokens()
        return {
            "num_running_reqs": ("The number of running requests.", len(self.running)),
            "num_queue_reqs": ("The number of requests in the waiting queue.", len(self.waiting)),
            "num_used_tokens": ("The number of used tokens.", used),
            "token_usage": ("The token usage.", used / self.capacity if self.capacity else 0.0),
            "gen_throughput": ("The generation throughput (token/s).", self.last_gen_throughput),
            "cache_hit_rate": ("The prefix cache hit rate.", self.last_cache_hit_rate),
            "max_total_num_tokens": ("Maximum total number of tokens in the KV cache pool.", self.capacity),
            "num_retracted_reqs": ("The number of retracted requests.", self.retracted_last_step),
        }

    # -- real-time driver --------------------------------------------------------------------
    async def run(self, on_crash: Callable[[], None]) -> None:
        """Step forever in (scaled) real time. Deadlines are absolute so that the Python cost of
        a step is absorbed instead of accumulating as drift."""
        deadline = time.monotonic()
        while True:
            while self.faults.hang:
                await self.faults.changed.wait()
                deadline = time.monotonic()
            step = self.plan()
            if step is None:
                self._wake.clear()
                waiter = asyncio.ensure_future(self._wake.wait())
                changed = asyncio.ensure_future(self.faults.changed.wait())
                await asyncio.wait({waiter, changed}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                changed.cancel()
                deadline = time.monotonic()
                continue
            seconds = step.duration * timing.jitter_factor(self.rng, self.config.jitter) * self.faults.slowdown
            deadline = max(deadline + seconds / self.config.time_scale, time.monotonic() - 0.5)
            delay = deadline - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                await asyncio.sleep(0)  # let the HTTP side breathe even when we are behind
            self.lag.record(time.monotonic() - deadline, seconds / self.config.time_scale)
            while self.faults.hang:  # a hang freezes the step in flight too; it completes after
                await self.faults.changed.wait()
                deadline = time.monotonic()
            self.complete(step, self.now())
            if self.crash_requested:
                await asyncio.sleep(0.05)  # let the streams flush the tokens produced so far
                on_crash()
