"""The HTTP face: a bare ASGI app (served by uvicorn with uvloop and httptools).

A framework would cost more per streamed chunk than the simulation itself; with hundreds of
concurrent streams per process that overhead is what limits us, so routing is a dict and
responses are written with msgspec.

Readiness and draining follow SGLang: ``/health`` is 503 while the model "loads" and while
draining; generation endpoints answer 503 then too. A client that disconnects aborts its
request in the engine (its KV is released, the radix cache keeps what was computed).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable

import msgspec

from . import protocol
from .config import SimConfig
from .engine import CRASH_EXIT_CODE, RequestError, SimEngine, SimRequest
from .faults import Faults

log = logging.getLogger("nimbus.sim")
_json = msgspec.json.Encoder()
_decode = msgspec.json.Decoder()
JSON = [(b"content-type", b"application/json")]
SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
HEALTH_GENERATE_TIMEOUT_S = 20.0
VERSION = "0.5.0-nimbus-sim"

Handler = Callable[[dict, Callable, Callable, bytes], Awaitable[None]]


async def send_json(send, status: int, payload, headers=()) -> None:
    body = _json.encode(payload)
    await send({"type": "http.response.start", "status": status,
                "headers": [*JSON, (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


async def send_text(send, status: int, text: str, content_type: bytes = b"text/plain; charset=utf-8") -> None:
    body = text.encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class SSEWriter:
    def __init__(self, send):
        self._send = send
        self.started = False

    async def start(self) -> None:
        await self._send({"type": "http.response.start", "status": 200, "headers": SSE})
        self.started = True

    async def event(self, payload) -> None:
        await self._send({"type": "http.response.body", "body": b"data: " + _json.encode(payload) + b"\n\n",
                          "more_body": True})

    async def done(self) -> None:
        await self._send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


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
        self.started = time.monotonic()
        self.ready_at = self.started + ready_delay
        self.draining = False
        self._engine_task: asyncio.Task | None = None
        get, post, delete = "GET", "POST", "DELETE"
        self.routes: dict[tuple[str, str], Handler] = {
            (post, "/generate"): self.generate,
            (post, "/v1/completions"): self.completions,
            (post, "/v1/chat/completions"): self.chat_completions,
            (get, "/v1/models"): self.models,
            (get, "/health"): self.health,
            (get, "/health_generate"): self.health_generate,
            (get, "/get_model_info"): self.model_info,
            (get, "/model_info"): self.model_info,
            (get, "/get_server_info"): self.server_info,
            (get, "/server_info"): self.server_info,
            (get, "/get_load"): self.get_load,
            (post, "/flush_cache"): self.flush_cache,
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

    # -- ASGI --------------------------------------------------------------------------------
    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        handler = self.routes.get((method, path))
        if handler is None:
            status, detail = (405, "Method Not Allowed") if path in self._paths else (404, "Not Found")
            await send_json(send, status, {"detail": detail})
            return
        if self.config.api_key and not self._authorized(scope, path):
            await send_json(send, 401, {"error": "Unauthorized"})
            return
        body = b""
        if method == "POST":
            more = True
            while more:
                message = await receive()
                body += message.get("body", b"")
                more = message.get("more_body", False)
        await handler(scope, receive, send, body)

    def _authorized(self, scope, path: str) -> bool:
        # SGLang's API-key middleware lets health checks and metrics through.
        if path.startswith("/health") or path.startswith("/metrics"):
            return True
        expected = b"Bearer " + self.config.api_key.encode()
        return any(k == b"authorization" and v == expected for k, v in scope["headers"])

    async def _lifespan(self, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._engine_task = asyncio.ensure_future(self.engine.run(on_crash=self._crash))
                delay = max(0.0, self.ready_at - time.monotonic())
                asyncio.get_running_loop().call_later(delay, self._announce_ready)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._engine_task:
                    self._engine_task.cancel()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _announce_ready(self) -> None:
        # The same line SGLang prints, for launchers that watch the log.
        log.info("The server is fired up and ready to roll!")

    @staticmethod
    def _crash() -> None:
        log.error("injected fault: crashing mid-stream")
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

    def _parse_body(self, body: bytes) -> dict:
        try:
            data = _decode.decode(body)
        except msgspec.DecodeError as exc:
            raise protocol.BadRequest(f"Invalid JSON body: {exc}") from exc
        if not isinstance(data, dict):
            raise protocol.BadRequest("The request body must be a JSON object.")
        return data

    def _submit(self, spec: protocol.GenerationSpec, rid: str | None = None) -> SimRequest:
        return self.engine.new_request(
            spec.prompt_ids, spec.max_new_tokens, spec.stop, spec.stop_token_ids, spec.ignore_eos, rid, spec.seed
        )

    def _watch_disconnect(self, receive, reqs: list[SimRequest]) -> asyncio.Future:
        async def watch() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    for req in reqs:
                        self.engine.abort(req)
                    return

        return asyncio.ensure_future(watch())

    async def _updates(self, req: SimRequest):
        """Yield each time ``stream_interval`` more tokens exist, and once at the end."""
        sent = 0
        interval = self.config.stream_interval
        while True:
            await req.event.wait()
            req.event.clear()
            count = len(req.output_ids)
            if req.done or count - sent >= interval:
                sent = count
                yield count
            if req.done:
                return

    async def _wait_done(self, req: SimRequest) -> None:
        while not req.done:
            await req.event.wait()
            req.event.clear()

    # -- native API --------------------------------------------------------------------------
    async def generate(self, scope, receive, send, body: bytes) -> None:
        reason = self._unavailable_reason()
        if reason:
            await send_json(send, 503, {"error": {"message": reason}})
            return
        try:
            data = self._parse_body(body)
            specs = protocol.parse_generate(data)
            stream = bool(data.get("stream", False))
            if stream and len(specs) > 1:
                raise protocol.BadRequest("Streaming a batch of prompts is not supported by the simulator.")
            rid = data.get("rid") if isinstance(data.get("rid"), str) else None
            reqs = [self._submit(spec, rid if len(specs) == 1 else None) for spec in specs]
        except (protocol.BadRequest, RequestError) as exc:
            await send_json(send, 400, {"error": {"message": str(exc)}})
            return
        watcher = self._watch_disconnect(receive, reqs)
        try:
            if stream:
                await self._stream_generate(send, reqs[0])
            else:
                for req in reqs:
                    await self._wait_done(req)
                results = [protocol.generate_payload(r) for r in reqs]
                if any(r.finish_reason and r.finish_reason["type"] == "abort" for r in reqs):
                    await send_json(send, 400, {"error": {"message": reqs[0].finish_reason["message"]}})
                else:
                    await send_json(send, 200, results if protocol.is_batch(data) else results[0])
        finally:
            watcher.cancel()

    async def _stream_generate(self, send, req: SimRequest) -> None:
        writer = SSEWriter(send)
        await writer.start()
        async for _ in self._updates(req):
            if req.finish_reason and req.finish_reason["type"] == "abort":
                await writer.event({"error": {"message": req.finish_reason["message"]}})
                break
            await writer.event(protocol.generate_payload(req))
        await writer.done()

    async def health(self, scope, receive, send, body: bytes) -> None:
        while self.faults.hang:  # a hung engine never answers; the caller's timeout decides
            await self.faults.changed.wait()
        healthy = self.ready and not self.draining and self.faults.health == "ok"
        await send_text(send, 200 if healthy else 503, "")

    async def health_generate(self, scope, receive, send, body: bytes) -> None:
        """A real one-token generation through the scheduler, as SGLang does it."""
        if not self.ready or self.draining or self.faults.health != "ok":
            await send_text(send, 503, "")
            return
        req = self.engine.new_request([1, 2, 3], 1, ignore_eos=True)
        try:
            await asyncio.wait_for(self._wait_done(req), HEALTH_GENERATE_TIMEOUT_S)
        except TimeoutError:
            self.engine.abort(req)
            await send_text(send, 503, "")
            return
        await send_text(send, 200, "")

    async def model_info(self, scope, receive, send, body: bytes) -> None:
        await send_json(send, 200, {
            "model_path": self.config.model_path,
            "tokenizer_path": self.config.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
        })

    async def server_info(self, scope, receive, send, body: bytes) -> None:
        engine = self.engine
        from . import timing  # local: keeps the hot import list of this module short

        weights_gb = timing.weight_bytes(self.config.model, self.config.quantization) / self.config.tp_size / 1e9
        kv_gb = engine.capacity * timing.kv_bytes_per_token(self.config.model, self.config.tp_size,
                                                             self.config.kv_cache_dtype) / 1e9
        await send_json(send, 200, {
            **self.config.server_args(),
            "version": VERSION,
            "internal_states": [{
                "last_gen_throughput": engine.last_gen_throughput,
                "memory_usage": {"weight": round(weights_gb, 2), "kvcache": round(kv_gb, 2),
                                 "token_capacity": engine.capacity},
                "max_total_num_tokens": engine.capacity,
                "num_running_reqs": len(engine.running),
                "num_queue_reqs": len(engine.waiting),
            }],
        })

    async def get_load(self, scope, receive, send, body: bytes) -> None:
        engine = self.engine
        await send_json(send, 200, [{
            "dp_rank": 0,
            "num_reqs": len(engine.running) + len(engine.waiting),
            "num_waiting_reqs": len(engine.waiting),
            "num_tokens": engine.used_tokens(),
        }])

    async def flush_cache(self, scope, receive, send, body: bytes) -> None:
        if self.engine.flush_cache():
            await send_text(send, 200, "Cache flushed.\nPlease check backend logs for more details. "
                                       "(When there are running or waiting requests, the operation will not be "
                                       "performed.)\n")
        else:
            await send_text(send, 400, "Cache not flushed. Please check backend logs for more details. "
                                       "(When there are running or waiting requests, the operation will not be "
                                       "performed.)\n")

    async def metrics(self, scope, receive, send, body: bytes) -> None:
        if not self.config.enable_metrics:  # SGLang mounts /metrics only with --enable-metrics
            await send_json(send, 404, {"detail": "Not Found"})
            return
        text = self.engine.metrics.render(self.engine.gauges())
        await send_text(send, 200, text, b"text/plain; version=0.0.4; charset=utf-8")

    # -- OpenAI API --------------------------------------------------------------------------
    async def models(self, scope, receive, send, body: bytes) -> None:
        await send_json(send, 200, {"object": "list", "data": [{
            "id": self.config.served_model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "sglang",
            "root": self.config.served_model_name,
            "max_model_len": self.config.context_length,
        }]})

    async def completions(self, scope, receive, send, body: bytes) -> None:
        await self._openai(receive, send, body, chat=False)

    async def chat_completions(self, scope, receive, send, body: bytes) -> None:
        await self._openai(receive, send, body, chat=True)

    async def _openai(self, receive, send, body: bytes, chat: bool) -> None:
        reason = self._unavailable_reason()
        if reason:
            await send_json(send, 503, protocol.openai_error(reason, 503, "ServiceUnavailableError"))
            return
        try:
            spec, echo = protocol.parse_openai(self._parse_body(body), chat)
            req = self._submit(spec)
        except (protocol.BadRequest, RequestError) as exc:
            await send_json(send, 400, protocol.openai_error(str(exc), 400))
            return
        cid, created = protocol.openai_id(chat), protocol.now_seconds()
        model = self.config.served_model_name
        watcher = self._watch_disconnect(receive, [req])
        try:
            if echo["stream"]:
                await self._stream_openai(send, req, cid, model, chat, created, echo["include_usage"])
                return
            await self._wait_done(req)
            if req.finish_reason and req.finish_reason["type"] == "abort":
                await send_json(send, 400, protocol.openai_error(req.finish_reason["message"], 400))
                return
            await send_json(send, 200, protocol.openai_response(req, cid, model, chat, created))
        finally:
            watcher.cancel()

    async def _stream_openai(self, send, req: SimRequest, cid: str, model: str, chat: bool, created: int,
                             include_usage: bool) -> None:
        writer = SSEWriter(send)
        await writer.start()
        if chat:  # OpenAI (and SGLang) open a chat stream with the role
            await writer.event(protocol.openai_chunk(cid, model, chat, created, "", req, first=True))
        sent = 0
        async for _ in self._updates(req):
            if req.finish_reason and req.finish_reason["type"] == "abort":
                await writer.event({"error": protocol.openai_error(req.finish_reason["message"], 400)})
                break
            text = req.text()
            delta, sent = text[sent:], max(sent, len(text))
            if req.done:
                if delta:
                    await writer.event(protocol.openai_chunk(cid, model, chat, created, delta, req))
                await writer.event(protocol.openai_chunk(cid, model, chat, created, None if chat else "", req,
                                                         final=True))
                if include_usage:
                    await writer.event(protocol.openai_usage_chunk(cid, model, chat, created, req))
            elif delta:
                await writer.event(protocol.openai_chunk(cid, model, chat, created, delta, req))
        await writer.done()

    # -- simulator admin ---------------------------------------------------------------------
    async def faults_get(self, scope, receive, send, body: bytes) -> None:
        await send_json(send, 200, self.faults.as_dict())

    async def faults_post(self, scope, receive, send, body: bytes) -> None:
        try:
            self.faults.update(self._parse_body(body))
        except (ValueError, TypeError) as exc:
            await send_json(send, 400, {"error": {"message": str(exc)}})
            return
        log.warning("faults now %s", self.faults.as_dict())
        await send_json(send, 200, self.faults.as_dict())

    async def faults_delete(self, scope, receive, send, body: bytes) -> None:
        self.faults.clear()
        await send_json(send, 200, self.faults.as_dict())

    async def drain(self, scope, receive, send, body: bytes) -> None:
        self.draining = True
        await send_json(send, 200, self._drain_state())

    async def undrain(self, scope, receive, send, body: bytes) -> None:
        self.draining = False
        await send_json(send, 200, self._drain_state())

    def _drain_state(self) -> dict:
        e = self.engine
        return {"draining": self.draining, "in_flight": len(e.running) + len(e.waiting) + (1 if e.chunked else 0)}

    async def stats(self, scope, receive, send, body: bytes) -> None:
        e = self.engine
        await send_json(send, 200, {
            "ready": self.ready,
            "draining": self.draining,
            "running": len(e.running),
            "waiting": len(e.waiting),
            "used_tokens": e.used_tokens(),
            "capacity": e.capacity,
            "radix_tokens": e.radix.total_size,
            "radix_evictable": e.radix.evictable_size,
            "sim_time_s": e.now(),
            "lag": e.lag.as_dict(),
            "generation_tokens": e.metrics.generation_tokens,
        })
