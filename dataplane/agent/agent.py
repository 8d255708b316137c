"""The node agent's lifecycle.

1. **Connect**: exchange the one-time bootstrap token for a node credential (``/register``), or,
   after an agent restart, resume with the stored credential (``/resume``). Either answer
   carries the node's *assignment*: which variant, how many replicas, how many GPUs each.
2. **Fetch** the model artifacts (``artifacts.fetch``: local → regional shared cache → source).
3. **Start** one supervised engine per replica from the one command template (``template``),
   each on its own GPUs and port; a replica is registered ``ready`` only after
   ``/health_generate`` passes.
4. **Heartbeat** every few seconds with each engine's scraped ``/metrics``; the answer may carry
   commands (``drain``, ``stop``). Replica state changes are reported at once, not at the next beat.
5. **Drain** on SIGTERM or on command: health turns 503, replicas turn ``draining`` (edges stop
   routing to them), in-flight requests finish up to the deadline, engines stop, the agent exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import httpx
import uvicorn

from dataplane.agent import artifacts, scrape, template
from dataplane.agent.client import ControlPlaneClient, Unauthorized
from dataplane.agent.config import AgentOptions
from dataplane.agent.engine import (
    DRAINING,
    FAILED,
    READY,
    Replica,
    Supervisor,
    SupervisorOptions,
    build_replica,
)
from dataplane.agent.metrics import AgentMetrics
from dataplane.agent.server import AgentHttp
from infra.bootstrap import AgentConfig

log = logging.getLogger("nimbus.agent")
VERSION = "0.1.0"
EXIT_OK, EXIT_REFUSED, EXIT_FAILED = 0, 3, 4


@dataclass(frozen=True)
class Assignment:
    """What the control plane wants on this node (the ``assignment`` object of the agent API)."""

    node_id: str
    model_path: str
    served_model_name: str
    replicas: int
    gpus_per_replica: int
    quantization: str | None = None
    context_length: int | None = None
    engine_args: dict | None = None
    artifact_source: str | None = None
    heartbeat_interval_s: float | None = None

    @classmethod
    def from_answer(cls, answer: dict) -> Assignment:
        a = answer["assignment"]
        return cls(node_id=answer["node_id"], model_path=a["model_path"], served_model_name=a["served_model_name"],
                   replicas=int(a["replicas"]), gpus_per_replica=int(a["gpus_per_replica"]),
                   quantization=a.get("quantization"), context_length=a.get("context_length"),
                   engine_args=a.get("engine_args") or {}, artifact_source=a.get("artifact_source"),
                   heartbeat_interval_s=answer.get("heartbeat_interval_s"))


def detect_gpus() -> list[int]:
    """GPU indices from ``nvidia-smi``; none on a CPU machine."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [int(line) for line in out.split() if line.strip().isdigit()]


def advertise_host_for(control_plane_url: str) -> str:
    """The local address that routes to the control plane: what peers in the VPC can reach."""
    parsed = urlparse(control_plane_url)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((parsed.hostname or "127.0.0.1", parsed.port or 80))
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class _QuietServer(uvicorn.Server):
    """uvicorn without its own signal handling: SIGTERM means *drain* here, not *exit now*."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


class NodeAgent:
    def __init__(self, config: AgentConfig, options: AgentOptions) -> None:
        self.config = config
        self.options = options
        self.metrics = AgentMetrics()
        self.engine = config.engine
        self.replicas: list[Replica] = []
        self.supervisors: list[Supervisor] = []
        self.draining = False
        self.node_id = config.node_id
        self.gpus: list[int] = []
        self.fetched: artifacts.Fetched | None = None
        self.agent_url: str | None = None
        self._started = time.monotonic()
        self._done = asyncio.Event()
        self._wake = asyncio.Event()
        self._deadline_changed = asyncio.Event()
        self._report_lock = asyncio.Lock()
        self._samples: dict[str, scrape.Sample] = {}
        self._last_scrape = time.monotonic()
        self._drain_task: asyncio.Task | None = None
        self._tasks: list[asyncio.Task] = []
        self.exit_code = EXIT_OK

    # -- the whole life --------------------------------------------------------------------
    async def run(self) -> int:
        o = self.options
        o.state_dir.mkdir(parents=True, exist_ok=True)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        async with httpx.AsyncClient() as http:
            self.http = http
            self.client = ControlPlaneClient(self.config.control_plane_url, http, o.state_dir / "credential")
            server, server_task = await self._serve_http()
            try:
                assignment = await self._connect()
                if assignment is not None and not self.draining:
                    await self._start_replicas(assignment)
                    await self._heartbeat_loop(assignment.heartbeat_interval_s or o.heartbeat_s)
                elif self._drain_task is not None:
                    await self._drain_task
            finally:
                for sup in self.supervisors:
                    await sup.stop()
                for task in self._tasks:
                    task.cancel()
                server.should_exit = True
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(server_task, 5)
        log.info("agent exiting", extra={"exit_code": self.exit_code})
        return self.exit_code

    def _on_signal(self, sig: int) -> None:
        if self.draining:  # a second signal: stop now
            log.warning("second signal: stopping without waiting", extra={"signal": sig})
            self._begin_drain(0.0, "second signal")
            return
        self._begin_drain(self.options.drain_deadline_s, signal.Signals(sig).name)

    async def _serve_http(self) -> tuple[uvicorn.Server, asyncio.Task]:
        sock = _bind(self.options.host, self.options.port)
        host = self.options.advertise_host or advertise_host_for(self.config.control_plane_url)
        self.advertise = host
        self.agent_url = f"http://{host}:{sock.getsockname()[1]}"
        (self.options.state_dir / "agent.url").write_text(self.agent_url)  # for local tools and tests
        app = AgentHttp(self.status, self.metrics.registry)
        server = _QuietServer(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
        task = asyncio.create_task(server.serve(sockets=[sock]))
        log.info("agent listening", extra={"url": self.agent_url})
        return server, task

    # -- 1. connect ------------------------------------------------------------------------
    def _facts(self) -> dict:
        self.gpus = detect_gpus()
        return {"agent_url": self.agent_url, "hostname": socket.gethostname(), "gpus": self.gpus,
                "engine": self.engine, "version": VERSION}

    async def _connect(self) -> Assignment | None:
        """Register (or resume), retrying while the control plane is unreachable; a refusal is final."""
        delay = 0.5
        while not self.draining:
            try:
                if self.client.load_credential():
                    answer = await self.client.resume(self._facts())
                else:
                    answer = await self.client.register(self.config.node_id, self.config.bootstrap_token,
                                                        self._facts())
                assignment = Assignment.from_answer(answer)
                self.node_id = assignment.node_id
                log.info("registered", extra={"node": self.node_id, "model": assignment.served_model_name,
                                              "replicas": assignment.replicas})
                return assignment
            except Unauthorized as exc:
                log.error("control plane refused this node; exiting", extra={"error": str(exc)})
                self.exit_code = EXIT_REFUSED
                return None
            except (httpx.HTTPError, KeyError, ValueError) as exc:
                log.warning("control plane unreachable; retrying", extra={"error": repr(exc), "delay_s": delay})
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._done.wait(), delay)
                delay = min(delay * 2, 15.0)
        return None

    # -- 2 + 3. artifacts and engines ------------------------------------------------------
    def _engine_kind(self) -> str:
        return template.choose_engine(self.options.engine or self.engine, self.gpus)

    def _cache_dir(self, wanted: str, fallback: str) -> Path:
        path = Path(wanted)
        try:
            path.mkdir(parents=True, exist_ok=True)
            return path
        except OSError:  # e.g. a local "node" cannot write /var/lib: keep the cache in the state dir
            return self.options.state_dir / fallback

    async def _start_replicas(self, a: Assignment) -> None:
        o = self.options
        engine = self._engine_kind()
        source = a.artifact_source or self.config.artifact_source
        local_cache = self._cache_dir(self.config.model_cache_dir, "models")
        try:
            self.fetched = await asyncio.to_thread(
                artifacts.fetch, a.model_path, local_cache_dir=local_cache,
                shared_cache_dir=o.shared_cache_dir, source=source)
        except Exception as exc:
            log.error("artifact fetch failed", extra={"model_path": a.model_path, "error": repr(exc)})
            self.fetched = artifacts.Fetched(a.model_path, "engine", 0.0)
        log.info("artifacts ready", extra={"path": self.fetched.path, "source": self.fetched.source,
                                           "download_s": round(self.fetched.download_s, 3)})
        gpu_pool = self.gpus or list(range(a.gpus_per_replica * a.replicas))  # CPU nodes: nominal GPUs
        blocks = template.assign_gpus(gpu_pool, a.gpus_per_replica, a.replicas)
        spec = template.EngineSpec(
            model_path=self.fetched.path, served_model_name=a.served_model_name, tp_size=a.gpus_per_replica,
            quantization=a.quantization, context_length=a.context_length, engine_args=a.engine_args or {},
            extra_args=tuple(self.config.engine_args) + (o.sim_args if engine == "sim" else ()))
        log.info("starting engines", extra={"engine": engine, "requested": self.options.engine or self.engine,
                                            "replicas": len(blocks), "gpus": blocks})
        sup_options = SupervisorOptions(ready_timeout_s=o.ready_timeout_s, backoff_base_s=o.backoff_base_s,
                                        backoff_cap_s=o.backoff_cap_s)
        for slot, gpu_ids in enumerate(blocks):
            port = o.engine_port_base + slot if o.engine_port_base else _free_port(o.host)
            argv = template.engine_command(spec, engine=engine, python=o.python, host=o.host, port=port)
            replica = build_replica(slot, argv, template.engine_env(engine, gpu_ids), self.advertise, port, gpu_ids,
                                    o.state_dir)
            sup = Supervisor(replica, self.http, self._on_replica_change, sup_options, self.fetched.download_s)
            self.replicas.append(replica)
            self.supervisors.append(sup)
            self._tasks.append(asyncio.create_task(self._supervise(sup)))
        await self._report_replicas()

    async def _supervise(self, sup: Supervisor) -> None:
        try:
            await sup.run()
        except Exception:
            log.exception("supervisor failed", extra={"slot": sup.replica.slot})
            sup.replica.state = FAILED
            await self._report_replicas()

    async def _on_replica_change(self, replica: Replica, event: str) -> None:
        if event == "ready":
            for phase, seconds in replica.ready_times.breakdown().items():
                self.metrics.model_ready.labels(phase).observe(seconds)
        elif event == "restarting":
            self.metrics.restarts.labels(str(replica.slot)).inc()
        self._samples.pop(replica.id, None)  # counters restart with the engine
        await self._report_replicas()

    async def _report_replicas(self) -> bool:
        """Tell the control plane about replica states now (best effort: the next heartbeat repeats it).
        False when the report was lost to a transient failure and is worth repeating."""
        self.metrics.observe_replicas([r.state for r in self.replicas])
        async with self._report_lock:
            try:
                await self.client.report_replicas([r.report() for r in self.replicas])
            except Unauthorized as exc:
                log.error("credential refused while reporting replicas", extra={"error": str(exc)})
                self._begin_drain(0.0, "credential refused")  # no retry can fix that
            except httpx.HTTPError as exc:
                log.warning("replica report failed; the next heartbeat repeats it", extra={"error": repr(exc)})
                return False
            return True

    FINAL_REPORT_ATTEMPTS = 5

    async def _report_final(self) -> None:
        """The "every replica stopped" report lets the control plane terminate this node at once, and
        no heartbeat follows it: a lost one would leave the node to its drain deadline or the stale
        sweep (which records it as failed). So it is retried a few times, backing off."""
        delay = 0.5
        for attempt in range(1, self.FINAL_REPORT_ATTEMPTS + 1):
            if await self._report_replicas():
                return
            if attempt < self.FINAL_REPORT_ATTEMPTS:
                await asyncio.sleep(delay)
                delay *= 2
        log.error("final replica report lost; the control plane falls back to the drain deadline",
                  extra={"attempts": self.FINAL_REPORT_ATTEMPTS})

    # -- 4. heartbeats ---------------------------------------------------------------------
    async def _scrape(self) -> None:
        now = time.monotonic()
        interval = now - self._last_scrape
        self._last_scrape = now

        async def one(r: Replica) -> None:
            if r.pid is None or r.state not in (READY, DRAINING):
                return
            try:
                resp = await self.http.get(r.url + "/metrics", timeout=3.0)
                sample = scrape.parse(resp.text)
            except (httpx.HTTPError, ValueError):
                return
            r.metrics = scrape.heartbeat_metrics(sample, self._samples.get(r.id), interval)
            self._samples[r.id] = sample

        await asyncio.gather(*(one(r) for r in self.replicas))
        self.metrics.in_flight.set(self.in_flight())

    def in_flight(self) -> int:
        return sum(scrape.in_flight(self._samples[r.id]) for r in self.replicas
                   if r.id in self._samples and r.pid is not None)

    def node_metrics(self) -> dict:
        return {
            "engine": self._engine_kind(),
            "gpus": self.gpus,
            "replicas_ready": sum(r.state == READY for r in self.replicas),
            "restarts": sum(r.restarts for r in self.replicas),
            "in_flight": self.in_flight(),
            "uptime_s": round(time.monotonic() - self._started, 1),
            "draining": self.draining,
            "artifacts": {"source": self.fetched.source, "download_s": round(self.fetched.download_s, 3)}
            if self.fetched else None,
            "agent_version": VERSION,
        }

    async def _heartbeat_loop(self, interval_s: float) -> None:
        while not self._done.is_set():
            await self._scrape()
            body = {"draining": self.draining, "agent_url": self.agent_url, "node_metrics": self.node_metrics(),
                    "replicas": [r.report() for r in self.replicas]}
            try:
                async with self._report_lock:
                    answer = await self.client.heartbeat(body)
                self.metrics.heartbeats.labels("ok").inc()
                interval_s = answer.get("heartbeat_interval_s") or interval_s
                for command in answer.get("commands", []):
                    self._apply(command)
            except Unauthorized as exc:
                self.metrics.heartbeats.labels("refused").inc()
                log.error("credential refused; stopping engines", extra={"error": str(exc)})
                self._begin_drain(0.0, "credential refused")
            except (httpx.HTTPError, ValueError) as exc:
                self.metrics.heartbeats.labels("error").inc()
                log.warning("heartbeat failed", extra={"error": repr(exc)})
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), interval_s)
        if self._drain_task is not None:
            await self._drain_task

    def _apply(self, command: dict) -> None:
        kind = command.get("type")
        if kind == "drain":
            self._begin_drain(float(command.get("deadline_s", self.options.drain_deadline_s)), "control plane")
        elif kind == "stop":
            self._begin_drain(0.0, "control plane stop")
        else:
            log.warning("unknown command ignored", extra={"command": command})

    # -- 5. drain --------------------------------------------------------------------------
    def _begin_drain(self, deadline_s: float, reason: str) -> None:
        deadline = time.monotonic() + max(0.0, deadline_s)
        if self._drain_task is not None:
            self._drain_deadline = min(self._drain_deadline, deadline)  # a later, stricter order wins
            self._deadline_changed.set()
            return
        self._drain_deadline = deadline
        self.draining = True
        self.metrics.draining.set(1)
        log.info("draining", extra={"reason": reason, "deadline_s": deadline_s})
        for sup in self.supervisors:
            sup.begin_drain()
        self._drain_task = asyncio.create_task(self._drain())
        self._wake.set()

    async def _drain(self) -> None:
        o = self.options
        await self._report_replicas()
        # Edges learn about the drain from their next snapshot; until then they may still send here.
        grace_until = time.monotonic() + o.drain_grace_s
        while (left := min(self._drain_deadline, grace_until) - time.monotonic()) > 0:
            self._deadline_changed.clear()  # a stricter order (second signal, stop) cuts the grace short
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._deadline_changed.wait(), left)
        while time.monotonic() < self._drain_deadline:
            await self._scrape()
            if self.in_flight() == 0:
                break
            await asyncio.sleep(0.2)
        left = self.in_flight()
        log.info("drained" if left == 0 else "drain deadline passed", extra={"in_flight": left})
        await asyncio.gather(*(sup.stop() for sup in self.supervisors))
        await self._report_final()
        self._done.set()
        self._wake.set()

    # -- introspection ---------------------------------------------------------------------
    def status(self) -> dict:
        return {
            "node_id": self.node_id,
            "draining": self.draining,
            "engine": self._engine_kind(),
            "agent_url": self.agent_url,
            "node_metrics": self.node_metrics(),
            "replicas": [{**r.report(), "pid": r.pid, "port": r.port, "argv": r.argv, "log": str(r.log_path)}
                         for r in self.replicas],
        }
