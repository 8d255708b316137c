"""The simulator's HTTP API, shaped like SGLang's (``http_server.py`` and its OpenAI adapters).

Readiness and draining follow SGLang: ``/health`` is 503 while the model "loads" and while
draining; generation endpoints answer 503 then too. A client that disconnects aborts its
request in the engine (its KV is released, the radix cache keeps what was computed).

``/health_generate`` is SGLang's: healthy as soon as the engine produces any output after the
check began. A busy engine gets no probe request at all (SGLang's scheduler drops a health
check while it has running work, so a full KV cache cannot starve it); an idle one runs a
one-token generation that counts in no metric. See ``CONFORMANCE.md`` for every behaviour and
where in SGLang's source it was read.

Streams are driven by the engine: each stream registers a listener on its request, and the
scheduler step that produces a token calls it, which writes the SSE event to the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable

import msgspec

from dataplane import httpserver as http

from . import embeddings, protocol, timing
from .config import SimConfig
from .engine import CRASH_EXIT_CODE, RequestError, SimEngine, SimRequest
from .faults import Faults

log = logging.getLogger("nimbus.sim")
_decode = msgspec.json.Decoder()
_encode = msgspec.json.Encoder().encode
HEALTH_GENERATE_TIMEOUT_S = 20.0
SHUTDOWN_POLL_S = 0.05
VERSION = "0.5.0-nimbus-sim"
FLUSH_NOTE = ("Please check backend logs for more details. (When there are running or waiting requests, "
              "the operation will not be performed.)\n")

Handler = Callable[[http.Request], Awaitable[None]]


class SimServer:
    def __init__(self, config: SimConfig, ready_delay: float = 0.0):
        self.config = config
        self.faults = Faults(
            health="fail" if config.fault_health_fail else "ok",
            hang=config.fault_hang,
            crash_after_tokens=config.fault_crash_after_tokens,
            slowdown=config.fault_slowdown,
            refuse=config.fault_refuse,
        )
        self.engine = SimEngine(config, faults=self.faults)
        self.ready_at = time.monotonic() + ready_delay
        self.draining = False  # /_sim/drain: the simulator's own gate (SGLang has no drain endpoint)
        self.shutting_down = False  # SIGTERM: SGLang's graceful exit (health 503, work finishes, then exit)
        get, post, delete = "GET", "POST", "DELETE"
        self.routes: dict[tuple[str, str], Handler] = {
            (post, "/generate"): self.generate,
            (post, "/v1/completions"): self.completions,
            (post, "/v1/chat/completions"): self.chat_completions,
            (post, "/v1/embeddings"): self.embeddings,
            (get, "/v1/models"): self.models,
            (get, "/ping"): self.ping,
            (get, "/health"): self.health,
            (get, "/health_generate"): self.health_generate,
            (get, "/get_model_info"): self.model_info,
            (get, "/model_info"): self.model_info,
            (get, "/get_server_info"): self.server_info,
            (get, "/server_info"): self.server_info,
            (get, "/get_load"): self.get_load,
            (post, "/flush_cache"): self.flush_cache,
            (post, "/abort_request"): self.abort_request,
            (get, "/flush_cache"): self.flush_cache,
            (get, "/metrics"): self.metrics,
            (get, "/_sim/faults"): self.faults_get,
            (post, "/_sim/faults"): self.faults_post,
            (delete, "/_sim/faults"): self.faults_delete,
            (post, "/_sim/drain"): self.drain,
            (delete, "/_sim/drain"): self.undrain,
            (get, "/_sim/stats"): self.stats,
        }
        self._paths = {path for _, path in self.routes}

    # -- dispatch ----------------------------------------------------------------------------
    async def dispatch(self, req: http.Request) -> None:
        handler = self.routes.get((req.method, req.path))
        if handler is None and req.method == "GET" and req.path.startswith("/v1/models/"):
            handler = self.retrieve_model
        if handler is None:
            status, detail = (405, "Method Not Allowed") if req.path in self._paths else (404, "Not Found")
            req.json(status, {"detail": detail})
            return
        if self.config.api_key and not self._authorized(req):
            req.json(401, {"error": "Unauthorized"})
            return
        await handler(req)

    def _authorized(self, req: http.Request) -> bool:
        # SGLang's API-key middleware lets health checks and metrics through.
        if req.path.startswith("/health") or req.path.startswith("/metrics"):
            return True
        return req.headers.get(b"authorization") == b"Bearer " + self.config.api_key.encode()

    # -- running -----------------------------------------------------------------------------
    async def serve_forever(self) -> None:
        loop = asyncio.get_running_loop()
        server = await http.serve(self.dispatch, self.config.host, self.config.port)
        engine_task = asyncio.ensure_future(self.engine.run(on_crash=self._crash))
        loop.call_later(max(0.0, self.ready_at - time.monotonic()), self._announce_ready)
        stop, again = asyncio.Event(), asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        # Graceful, as SGLang's tokenizer manager does on SIGTERM: health checks answer 503 at once,
        # requests keep being served (new ones too), and the process exits once none is left. A
        # second signal exits at once. (SGLang polls for "no request left" every 5 s; we poll faster.)
        self.shutting_down = True
        log.info("SIGTERM received: finishing %d request(s) before exiting", self._in_flight())
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, again.set)
        while self.engine.has_work() and not again.is_set():
            # Polling, as SGLang's watchdog does (the engine has no "idle" event); a second signal wakes it.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(again.wait(), SHUTDOWN_POLL_S)
        await asyncio.sleep(SHUTDOWN_POLL_S)  # let the last responses be written
        server.close()
        engine_task.cancel()

    def _announce_ready(self) -> None:
        # The same line SGLang prints, for launchers that watch the log.
        log.info("The server is fired up and ready to roll!")

    @staticmethod
    def _crash() -> None:
        log.error("injected fault: crashing mid-stream")
        logging.shutdown()
        os._exit(CRASH_EXIT_CODE)

    # -- shared gates ------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return time.monotonic() >= self.ready_at

    def _unavailable_reason(self) -> str | None:
        if not self.ready:
            return "The server is not ready yet (model is loading)."
        if self.draining:
            return "The server is draining and does not accept new requests."
        if self.faults.refuse:
            return "The server refused the request (injected fault)."
        return None

    @staticmethod
    def _parse_body(body: bytes) -> dict:
        try:
            data = _decode.decode(body)
        except msgspec.DecodeError as exc:
            raise protocol.BadRequest(f"Invalid JSON body: {exc}") from exc
        if not isinstance(data, dict):
            raise protocol.BadRequest("The request body must be a JSON object.")
        return data

    def _submit(self, spec: protocol.GenerationSpec, rid: str | None = None) -> SimRequest:
        return self.engine.new_request(
            spec.prompt_ids, spec.max_new_tokens, spec.stop, spec.stop_token_ids, spec.ignore_eos, rid, spec.seed,
            priority=spec.priority, forced=spec.forced,
        )

    def _abort_on_disconnect(self, req: http.Request, sims: list[SimRequest]) -> None:
        def abort() -> None:
            for sim in sims:
                self.engine.abort(sim)

        req.conn.on_close(abort)

    @staticmethod
    def _when_done(sims: list[SimRequest]) -> asyncio.Future:
        """A future resolved once every request has finished (one callback per request end)."""
        future = asyncio.get_running_loop().create_future()
        pending = {id(s) for s in sims}

        def listener(sim: SimRequest) -> None:
            if sim.done and id(sim) in pending:
                pending.discard(id(sim))
                if not pending and not future.done():
                    future.set_result(None)

        for sim in sims:
            sim.listener = listener
            listener(sim)  # already finished (e.g. aborted before we got here)
        return future

    @staticmethod
    def _aborted(sim: SimRequest) -> bool:
        return sim.finish_reason is not None and sim.finish_reason["type"] == "abort"

    # -- native API --------------------------------------------------------------------------
    async def generate(self, req: http.Request) -> None:
        reason = self._unavailable_reason()
        if reason:
            req.json(503, {"error": {"message": reason}})
            return
        try:
            data = self._parse_body(req.body)
            specs = protocol.parse_generate(data)
            stream = bool(data.get("stream", False))
            if stream and len(specs) > 1:
                raise protocol.BadRequest("Streaming a batch of prompts is not supported by the simulator.")
            rids = self._rids(data.get("rid"), len(specs))
            sims = [self._submit(spec, rid) for spec, rid in zip(specs, rids, strict=True)]
        except protocol.ValidationFailed as exc:  # FastAPI's request validation: 400, flat ErrorResponse
            req.json(400, protocol.openai_error(str(exc), 400, "Bad Request"))
            return
        except protocol.InternalError as exc:  # SGLang: a TypeError outside its ValueError handler
            log.error("generate failed: %s", exc)
            req.send(500, b"Internal Server Error")
            return
        except RequestError as exc:
            req.json(exc.status, {"error": {"message": str(exc)}})
            return
        except protocol.BadRequest as exc:
            req.json(400, {"error": {"message": str(exc)}})
            return
        self._abort_on_disconnect(req, sims)
        if stream:
            req.start_sse()
            sims[0].listener = NativeStream(req, self.config.stream_interval)
            return
        await self._when_done(sims)
        # An aborted request (client gone, /abort_request) is answered like any other, its
        # finish_reason {"type": "abort", "message": ...}: SGLang raises only for aborts that carry
        # a 400/500/503 status, and the simulator's aborts carry none.
        results = [protocol.generate_payload(s) for s in sims]
        req.json(200, results if protocol.is_batch(data) else results[0])

    @staticmethod
    def _rids(value, count: int) -> list[str | None]:
        """``rid`` as SGLang takes it: a string for one prompt, a list with one per prompt for a batch."""
        if value is None:
            return [None] * count
        if count == 1 and isinstance(value, str):
            return [value]
        if isinstance(value, list) and len(value) == count and all(isinstance(r, str) for r in value):
            return list(value)
        raise protocol.BadRequest("The rid should be a string for one prompt or a list with one per prompt.")

    async def ping(self, req: http.Request) -> None:
        req.send(200, b"")  # SageMaker's health route: the HTTP server is up, nothing more

    async def retrieve_model(self, req: http.Request) -> None:
        name = req.path[len("/v1/models/"):]
        if name != self.config.served_model_name:
            req.json(404, {"error": {"message": f"The model '{name}' does not exist", "type": "invalid_request_error",
                                     "param": "model", "code": "model_not_found"}})
            return
        req.json(200, self._model_card())

    async def health(self, req: http.Request) -> None:
        while self.faults.hang:  # a hung engine never answers; the caller's timeout decides
            await self.faults.changed.wait()
        healthy = self.ready and not self.draining and not self.shutting_down and self.faults.health == "ok"
        req.send(200 if healthy else 503, b"")

    async def health_generate(self, req: http.Request) -> None:
        """Healthy once the engine makes progress after the check began (SGLang's semantics): any
        token of any request counts. Idle, a one-token probe (no metrics) makes that progress; busy,
        no probe is queued, so a saturated engine that is still decoding answers within a step."""
        if not self.ready or self.draining or self.shutting_down or self.faults.health != "ok":
            req.send(503, b"")
            return
        engine = self.engine
        progress = engine.wait_progress()
        probe = None
        if not (engine.running or engine.chunked):
            probe = engine.new_request([0], 1, ignore_eos=True, rid=f"HEALTH_CHECK_{time.time()}", log_metrics=False)
        waiters = {progress} | ({self._when_done([probe])} if probe is not None else set())
        try:
            done, _ = await asyncio.wait(waiters, timeout=HEALTH_GENERATE_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
            if probe is not None and not probe.done:
                engine.abort(probe)  # answered by other progress first: the probe's slot is not needed
        req.send(200 if done and not (self.draining or self.shutting_down) else 503, b"")

    async def model_info(self, req: http.Request) -> None:
        req.json(200, {
            "model_path": self.config.model_path,
            "tokenizer_path": self.config.model_path,
            "is_generation": not self.config.is_embedding,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
        })

    async def server_info(self, req: http.Request) -> None:
        """SGLang's shape: the server args as given (``max_running_requests`` and ``max_total_tokens``
        are null unless passed), the scheduler's info at top level (``max_total_num_tokens``,
        ``max_req_input_len``), and one ``internal_states`` entry per DP rank with the effective
        running-request cap (``effective_max_running_requests_per_dp``)."""
        engine, config = self.engine, self.config
        weights_gb = timing.weight_bytes(config.model, config.quantization) / config.tp_size / 1e9
        kv_gb = engine.capacity * timing.kv_bytes_per_token(config.model, config.tp_size, config.kv_cache_dtype) / 1e9
        req.json(200, {
            **config.server_args(),
            "max_total_num_tokens": engine.capacity,
            "max_req_input_len": min(config.context_length - 1, engine.capacity - 1),
            "version": VERSION,
            "internal_states": [{
                "last_gen_throughput": engine.last_gen_throughput,
                "memory_usage": {"weight": round(weights_gb, 2), "kvcache": round(kv_gb, 2),
                                 "token_capacity": engine.capacity, "graph": 0},
                "effective_max_running_requests_per_dp": config.max_running_requests,
                # Simulator extras (not in SGLang's internal state):
                "max_total_num_tokens": engine.capacity,
                "num_running_reqs": len(engine.running),
                "num_queue_reqs": len(engine.waiting),
            }],
        })

    async def get_load(self, req: http.Request) -> None:
        engine = self.engine
        # One entry per data-parallel rank; without DP SGLang reports rank/rid/ipc as null.
        req.json(200, [{
            "rid": None,
            "http_worker_ipc": None,
            "dp_rank": None,
            "num_reqs": len(engine.running) + len(engine.waiting),
            "num_waiting_reqs": len(engine.waiting),
            "num_tokens": engine.used_tokens(),
        }])

    async def abort_request(self, req: http.Request) -> None:
        try:
            data = self._parse_body(req.body)
        except protocol.BadRequest as exc:
            req.json(400, {"error": {"message": str(exc)}})
            return
        rid = data.get("rid") or ""
        self.engine.abort_rid(rid if isinstance(rid, str) else "", bool(data.get("abort_all", False)))
        req.send(200, b"")

    async def flush_cache(self, req: http.Request) -> None:
        # SGLang sends the same text either way; only the status tells success (200) from refusal (400).
        req.send(200 if self.engine.flush_cache() else 400, ("Cache flushed.\n" + FLUSH_NOTE).encode())

    async def metrics(self, req: http.Request) -> None:
        if not self.config.enable_metrics:  # SGLang mounts /metrics only with --enable-metrics
            req.json(404, {"detail": "Not Found"})
            return
        text = self.engine.metrics.render(self.engine.gauges())
        req.send(200, text.encode(), b"text/plain; version=0.0.4; charset=utf-8")

    # -- OpenAI API --------------------------------------------------------------------------
    def _model_card(self) -> dict:
        name = self.config.served_model_name
        return {"id": name, "object": "model", "created": int(time.time()), "owned_by": "sglang", "root": name,
                "max_model_len": self.config.context_length}

    async def models(self, req: http.Request) -> None:
        req.json(200, {"object": "list", "data": [self._model_card()]})

    async def completions(self, req: http.Request) -> None:
        await self._openai(req, chat=False)

    async def chat_completions(self, req: http.Request) -> None:
        await self._openai(req, chat=True)

    async def embeddings(self, req: http.Request) -> None:
        reason = self._unavailable_reason()
        if reason:
            req.json(503, protocol.openai_error(reason, 503, "ServiceUnavailableError"))
            return
        if not self.config.is_embedding:
            req.json(400, protocol.openai_error("This model is not an embedding model (start it with --is-embedding).",
                                                400))
            return
        dim = self.config.model.hidden
        sims: list[SimRequest] = []
        try:
            body = self._parse_body(req.body)
            dimensions, encoding = embeddings.options(body, dim)
            inputs = embeddings.parse_inputs(body)
            for ids in inputs:  # each input is one prefill with no output token, as SGLang runs it
                sims.append(self.engine.new_request(ids, 0, priority=protocol.priority_field(body)))
        except (protocol.BadRequest, RequestError) as exc:
            for sim in sims:
                self.engine.abort(sim)
            status = getattr(exc, "status", 400)
            req.json(status, protocol.openai_error(str(exc), status))
            return
        self._abort_on_disconnect(req, sims)
        await self._when_done(sims)
        if any(self._aborted(sim) for sim in sims):
            req.json(400, protocol.openai_error("aborted", 400))
            return
        req.json(200, embeddings.response(inputs, dim, self.config.served_model_name, dimensions, encoding))

    async def _openai(self, req: http.Request, chat: bool) -> None:
        reason = self._unavailable_reason()
        if reason:
            req.json(503, protocol.openai_error(reason, 503, "ServiceUnavailableError"))
            return
        if self.config.is_embedding:
            req.json(400, protocol.openai_error("This model is an embedding model (--is-embedding); it does not "
                                                "generate text.", 400))
            return
        sims: list[SimRequest] = []
        try:
            specs, options = protocol.parse_openai(self._parse_body(req.body), chat, self.config.seed)
            try:
                for spec in specs:  # n > 1: one engine request per choice, as SGLang's parallel sampling
                    sims.append(self._submit(spec))
            except RequestError:
                for sim in sims:  # a later choice was refused (queue full): the earlier ones go too
                    self.engine.abort(sim)
                raise
        except protocol.ValidationFailed as exc:
            req.json(400, protocol.openai_error(str(exc), 400, "Bad Request"))
            return
        except RequestError as exc:
            err_type = "ServiceUnavailableError" if exc.status == 503 else "BadRequestError"
            req.json(exc.status, protocol.openai_error(str(exc), exc.status, err_type))
            return
        except protocol.BadRequest as exc:
            req.json(400, protocol.openai_error(str(exc), 400))
            return
        self._abort_on_disconnect(req, sims)
        cid, created, model = protocol.openai_id(chat), protocol.now_seconds(), self.config.served_model_name
        if options.stream:
            req.start_sse()
            group = OpenAIStreamGroup(req, cid, model, chat, created, options, sims)
            for index, sim in enumerate(sims):
                sim.listener = OpenAIStream(group, index, self.config.stream_interval)
            return
        await self._when_done(sims)
        aborted = next((sim for sim in sims if self._aborted(sim)), None)
        if aborted is not None:
            req.json(400, protocol.openai_error(aborted.finish_reason["message"], 400))
            return
        req.json(200, protocol.openai_response(sims, cid, model, chat, created, options))

    # -- simulator admin ---------------------------------------------------------------------
    async def faults_get(self, req: http.Request) -> None:
        req.json(200, self.faults.as_dict())

    async def faults_post(self, req: http.Request) -> None:
        try:
            self.faults.update(self._parse_body(req.body))
        except (ValueError, TypeError) as exc:
            req.json(400, {"error": {"message": str(exc)}})
            return
        log.warning("faults now %s", self.faults.as_dict())
        req.json(200, self.faults.as_dict())

    async def faults_delete(self, req: http.Request) -> None:
        self.faults.clear()
        req.json(200, self.faults.as_dict())

    async def drain(self, req: http.Request) -> None:
        self.draining = True
        req.json(200, self._drain_state())

    async def undrain(self, req: http.Request) -> None:
        self.draining = False
        req.json(200, self._drain_state())

    def _in_flight(self) -> int:
        e = self.engine
        return len(e.running) + len(e.waiting) + (1 if e.chunked and e.chunked not in e.running else 0)

    def _drain_state(self) -> dict:
        return {"draining": self.draining, "in_flight": self._in_flight()}

    async def stats(self, req: http.Request) -> None:
        e = self.engine
        req.json(200, {
            "ready": self.ready,
            "draining": self.draining,
            "running": len(e.running),
            "waiting": len(e.waiting),
            "used_tokens": e.used_tokens(),
            "capacity": e.capacity,
            "radix_tokens": e.radix.total_size,
            "radix_evictable": e.radix.evictable_size,
            "retractions": e.retractions,
            "preemptions": e.preemptions,
            "sim_time_s": e.now(),
            "lag": e.lag.as_dict(),
            "generation_tokens": e.metrics.generation_tokens,
        })


class NativeStream:
    """``/generate`` streaming: one event per ``stream_interval`` tokens, cumulative text."""

    __slots__ = ("interval", "req", "sent")

    def __init__(self, req: http.Request, interval: int):
        self.req, self.interval, self.sent = req, interval, 0

    def __call__(self, sim: SimRequest) -> None:
        count = len(sim.output_ids)
        if not sim.done and count - self.sent < self.interval:
            return
        self.sent = count
        self.req.sse(protocol.generate_payload(sim))  # an abort ends the stream with finish_reason "abort"
        if sim.done:
            self.req.sse_done()


class OpenAIStreamGroup:
    """The shared end of one OpenAI stream: ``n`` choices write into it, each with its index; the
    usage chunk (all choices summed) and ``[DONE]`` follow the last choice's finish chunk."""

    __slots__ = ("chat", "cid", "created", "finished", "model", "options", "req", "sims")

    def __init__(self, req: http.Request, cid: str, model: str, chat: bool, created: int,
                 options: protocol.OpenAIOptions, sims: list[SimRequest]):
        self.req, self.cid, self.model, self.chat, self.created = req, cid, model, chat, created
        self.options, self.sims, self.finished = options, sims, 0

    def chunk(self, index: int, delta: str | None, req: SimRequest | None = None, **kw) -> dict:
        return protocol.openai_chunk(self.cid, self.model, self.chat, self.created, delta, req, index=index, **kw)

    def choice_done(self) -> None:
        self.finished += 1
        if self.finished < len(self.sims):
            return
        if self.options.include_usage:
            self.req.sse(protocol.openai_usage_chunk(self.cid, self.model, self.chat, self.created, self.sims))
        self.req.sse_done()


class OpenAIStream:
    """One choice of an OpenAI SSE stream: role chunk (chat), text deltas (with their logprobs when
    asked, or as tool-call argument deltas the way SGLang's parser streams them), a finish chunk."""

    __slots__ = ("constraint", "group", "index", "interval", "plain", "prefix", "sent_pieces", "sent_text",
                 "sent_tokens", "suffix")

    _MARK = "\x00delta\x00"

    def __init__(self, group: OpenAIStreamGroup, index: int, interval: int):
        self.group, self.index, self.interval = group, index, interval
        self.sent_text = self.sent_tokens = self.sent_pieces = 0
        options = group.options
        self.constraint = options.constraints[index] if index < len(options.constraints) else None
        self.plain = options.logprobs is None and not (self.constraint is not None and self.constraint.kind == "tool_call"
                                                       and group.chat)
        # Every plain mid-stream chunk is the same JSON but for the delta: encode it once, split
        # around the delta, and per token only encode the delta string.
        template = b"data: " + _encode(group.chunk(index, self._MARK)) + b"\n\n"
        self.prefix, self.suffix = template.split(_encode(self._MARK))
        if group.chat:  # OpenAI (and SGLang) open a chat stream with the role
            group.req.sse(group.chunk(index, "", first=True))

    def _delta(self, sim: SimRequest) -> str:
        # Join only the new pieces: re-joining the whole text per token would be quadratic.
        if sim.text_cut is None:
            delta = "".join(sim.pieces[self.sent_pieces:])
            self.sent_pieces = len(sim.pieces)
        else:  # a stop string matched: the text was cut, possibly inside what is already sent
            delta = sim.text()[self.sent_text:]
        self.sent_text += len(delta)
        return delta

    def __call__(self, sim: SimRequest) -> None:
        count = len(sim.output_ids)
        if not sim.done and count - self.sent_tokens < self.interval:
            return
        group, start = self.group, self.sent_tokens
        self.sent_tokens = count
        if SimServer._aborted(sim):
            group.req.sse({"error": protocol.openai_error(sim.finish_reason["message"], 400)})
            group.req.sse_done()
            return
        text_before = self.sent_text
        delta = self._delta(sim)
        if delta and self.plain:
            group.req.sse_raw(self.prefix + _encode(delta) + self.suffix)
        elif delta:
            logprobs = protocol.choice_logprobs(sim, group.chat, group.options.logprobs, start, count, text_before)
            if self.constraint is not None and self.constraint.kind == "tool_call" and group.chat:
                call: dict = {"index": 0, "function": {"arguments": delta}}
                if text_before == 0:  # the first delta names the call
                    call.update(id=protocol.tool_call_id(sim), type="function")
                    call["function"] = {"name": self.constraint.tool, "arguments": delta}
                group.req.sse(group.chunk(self.index, None, tool_calls=[call], logprobs=logprobs))
            else:
                group.req.sse(group.chunk(self.index, delta, logprobs=logprobs))
        if not sim.done:
            return
        finish, _ = protocol.openai_finish(sim)
        called = protocol.answers_with_tool_call(sim, self.constraint, finish) and group.chat
        group.req.sse(group.chunk(self.index, None if group.chat else "", sim, final=True,
                                  finish="tool_calls" if called else None))
        group.choice_done()
