"""The node agent's lifecycle.

1. **Connect**: exchange the one-time bootstrap token for a node credential (``/register``), or,
   after an agent restart, resume with the stored credential (``/resume``). Either answer, and
   every heartbeat answer after it, carries the node's *replica list*: each replica the control
   plane placed here, with its id, variant and GPU indices, and whether it should run or stop.
2. **Reconcile** the list (``replicas.plan_replica_changes``, pure) every time it arrives: start
   the new ones, drain the ones marked stopped or no longer listed, wait for GPUs still held,
   refuse GPUs the machine does not have. Replicas of different pools share the node.
3. **Start** each replica as its own task: fetch its artifacts (``artifacts.fetch``: local →
   regional shared cache → source; once per model path on the node), build its command from the
   one template (``template``) with ``--tp-size`` = its GPU count and ``CUDA_VISIBLE_DEVICES`` =
   its GPU indices (the simulator gets them too), supervise it; it is registered ``ready`` only
   after ``/health_generate`` passes.
4. **Heartbeat** every few seconds with each engine's scraped ``/metrics``; the answer may carry
   node commands (``drain``, ``stop``) and a changed replica list. Replica state changes are
   reported at once, not at the next beat.
5. **Drain one replica** (the list says so): it turns ``draining`` at once, in-flight requests
   finish up to its deadline, its engine stops, it is reported ``stopped`` until the list no
   longer names it. The node and its other replicas carry on.
6. **Drain the node** on SIGTERM or on command: health turns 503, every replica turns
   ``draining`` (edges stop routing to them), in-flight requests finish up to the deadline,
   engines stop, the final "all stopped" report is retried, the agent exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlparse

import httpx
import uvicorn

from dataplane.agent import artifacts, scrape, template
from dataplane.agent.backoff import Backoff
from dataplane.agent.client import ControlPlaneClient, Unauthorized
from dataplane.agent.config import AgentOptions
from dataplane.agent.engine import (
    DRAINING,
    FAILED,
    READY,
    STARTING,
    STOPPED,
    Replica,
    Supervisor,
    SupervisorOptions,
    build_replica,
)
from dataplane.agent.metrics import AgentMetrics
from dataplane.agent.replicas import (
    LocalView,
    ParsedList,
    ReplicaEntry,
    engine_port,
    parse_replica_list,
    plan_replica_changes,
)
from dataplane.agent.server import AgentHttp
from infra.bootstrap import AgentConfig

log = logging.getLogger("nimbus.agent")
VERSION = "0.2.0"
EXIT_OK, EXIT_REFUSED, EXIT_FAILED = 0, 3, 4
DRAIN_POLL_S = 0.2


def sim_args(configured: tuple[str, ...], fetched: artifacts.Fetched) -> tuple[str, ...]:
    """The simulator's own flags for one replica: the node's, and ``--weights-cached`` where the
    weights were already on the node, so its modelled cold start skips the download as the real
    engine's does (``dataplane.sim.timing.model_ready_seconds``)."""
    return tuple(configured) + (("--weights-cached",) if fetched.on_node else ())


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


@dataclass(eq=False)
class LocalReplica:
    """One replica of the control plane's list that this agent has: its engine (once started), the
    task that fetches and supervises it, and its own drain."""

    entry: ReplicaEntry
    replica: Replica
    supervisor: Supervisor | None = None
    task: asyncio.Task | None = None  # fetch artifacts, then supervise the engine
    drain_task: asyncio.Task | None = None
    drain_deadline: float = math.inf
    deadline_changed: asyncio.Event = field(default_factory=asyncio.Event)
    reported_state: str | None = None  # the last state a report the control plane took carried

    @property
    def holds_gpus(self) -> bool:
        """Its engine may still be on its GPUs: anything but stopped/failed with no live process."""
        r = self.replica
        return not (r.state in (STOPPED, FAILED) and r.pid is None)

    def view(self) -> LocalView:
        r = self.replica
        done = r.state in (STOPPED, FAILED) and not self.holds_gpus
        return LocalView(id=r.id, gpu_ids=tuple(r.gpu_ids), holds_gpus=self.holds_gpus,
                         stopping=self.drain_task is not None or r.state in (STOPPED, FAILED),
                         final_reported=done and self.reported_state == r.state)


class NodeAgent:
    def __init__(self, config: AgentConfig, options: AgentOptions) -> None:
        self.config = config
        self.options = options
        self.metrics = AgentMetrics()
        self.engine = config.engine
        self.local: dict[str, LocalReplica] = {}  # by the control plane's replica id, in arrival order
        self.draining = False
        self.node_id = config.node_id
        self.node_state: str | None = None
        self.gpus: list[int] = []
        self.agent_url: str | None = None
        self.advertise = options.advertise_host or "127.0.0.1"
        self._listed: ParsedList | None = None  # the last replica list the control plane sent
        self._waiting: set[str] = set()  # entries waiting for GPUs (logged once each)
        self._list_errors: tuple[str, ...] = ()
        self._fetches: dict[tuple[str, str | None], asyncio.Task] = {}
        self._artifacts: dict[str, dict] = {}
        self._started = time.monotonic()
        self._done = asyncio.Event()
        self._wake = asyncio.Event()
        self._deadline_changed = asyncio.Event()
        self._report_lock = asyncio.Lock()
        self._samples: dict[str, scrape.Sample] = {}
        self._last_scrape = time.monotonic()
        self._drain_task: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._sup_options = SupervisorOptions(ready_timeout_s=options.ready_timeout_s,
                                              backoff_base_s=options.backoff_base_s,
                                              backoff_cap_s=options.backoff_cap_s,
                                              probe_interval_s=options.probe_interval_s,
                                              probe_timeout_s=options.probe_timeout_s,
                                              probe_failures=options.probe_failures)
        # Calls to the control plane back off together: while heartbeats fail, replica reports are
        # not sent on their own (the next heartbeat carries every replica's latest state).
        self._cp_backoff = self._new_backoff()
        self._cp_down_since: float | None = None  # monotonic time of the first failure in a row
        self._report_waiting = False  # a report is waiting for the lock: it will send the latest state
        # One per agent process, in register/resume facts: a resume repeated by this process (its answer
        # lost) is known to the control plane as a repeat and stops none of the engines the first started.
        self.boot_id = uuid.uuid4().hex
        self.exit_code = EXIT_OK

    @property
    def replicas(self) -> list[Replica]:
        return [m.replica for m in self.local.values()]

    def _spawn_task(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- the whole life --------------------------------------------------------------------
    async def run(self) -> int:
        o = self.options
        o.state_dir.mkdir(parents=True, exist_ok=True)
        self.remember_cached()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        async with httpx.AsyncClient() as http:
            self.http = http
            self.client = ControlPlaneClient(self.config.control_plane_url, http, o.state_dir / "credential",
                                             timeout_s=o.cp_timeout_s)
            server, server_task = await self._serve_http()
            try:
                answer = await self._connect()
                if answer is not None and not self.draining:
                    interval = self._apply_answer(answer, o.heartbeat_s)
                    await self._heartbeat_loop(interval)
                elif self._drain_task is not None:
                    await self._drain_task
            finally:
                for m in list(self.local.values()):
                    await self._stop_local(m)
                for task in list(self._tasks):
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
                "engine": self.engine, "version": VERSION, "boot_id": self.boot_id}

    def _new_backoff(self) -> Backoff:
        o = self.options
        return Backoff(o.cp_retry_base_s, o.cp_retry_cap_s, o.cp_retry_jitter)

    async def _connect(self) -> dict | None:
        """Register (or resume), retrying with backoff while the control plane is unreachable, slow
        or failing (a timeout, a refused connection, a 5xx); a refusal (401/403) is final.

        A register whose answer was lost is repeated with the same bootstrap token: the control plane
        answers a repeat within its grace period with the same credential."""
        backoff = self._new_backoff()
        answer_lost = False  # an earlier register may have reached the control plane
        while not self.draining:
            try:
                if self.client.load_credential():
                    answer = await self.client.resume(self._facts())
                else:
                    try:
                        answer = await self.client.register(self.config.node_id, self.config.bootstrap_token,
                                                            self._facts())
                    except Unauthorized:
                        if answer_lost:
                            log.error("bootstrap token refused on a repeated register (an earlier attempt's "
                                      "answer was lost): its retry window has passed or the credential was used")
                        raise
                    except (httpx.TimeoutException, httpx.RemoteProtocolError, httpx.ReadError):
                        answer_lost = True  # sent, perhaps handled, no answer
                        raise
                if not isinstance(answer, dict):
                    raise ValueError(f"the answer is not an object: {answer!r:.200}")
                self.node_id = answer.get("node_id") or self.node_id
                listed = answer.get("replicas")
                log.info("registered", extra={"node": self.node_id, "node_state": answer.get("node_state"),
                                              "replicas": len(listed) if isinstance(listed, list) else None})
                return answer
            except Unauthorized as exc:
                log.error("control plane refused this node; exiting", extra={"error": str(exc)})
                self.exit_code = EXIT_REFUSED
                return None
            except (httpx.HTTPError, KeyError, ValueError) as exc:
                delay = backoff.next_delay()
                log.warning("control plane unreachable; retrying", extra={
                    "error": _describe(exc), "attempt": backoff.failures, "delay_s": round(delay, 2)})
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._done.wait(), delay)
        return None

    def _apply_answer(self, answer: dict, interval_s: float) -> float:
        """Everything a register/resume/heartbeat answer says: node state, heartbeat interval, node
        commands, the replica list. Unknown fields are ignored; nothing in it can crash the agent.
        Returns the heartbeat interval to use."""
        if isinstance(answer.get("node_state"), str):
            self.node_state = answer["node_state"]
        wanted = answer.get("heartbeat_interval_s")
        if isinstance(wanted, int | float) and not isinstance(wanted, bool) and 0 < wanted < 3600:
            interval_s = float(wanted)
        commands = answer.get("commands") or []
        for command in commands if isinstance(commands, list) else [commands]:
            try:
                self._apply(command)
            except (AttributeError, TypeError, ValueError) as exc:
                log.warning("malformed command ignored", extra={"command": repr(command)[:300], "error": repr(exc)})
        if "replicas" in answer:
            parsed = parse_replica_list(answer["replicas"])
            if parsed is None:
                log.warning("replica list is not a list; keeping what runs",
                            extra={"replicas": repr(answer["replicas"])[:300]})
            else:
                if parsed.errors != self._list_errors:  # the same bad entry is not logged every beat
                    for line in parsed.errors:
                        log.error("malformed replica entry skipped", extra={"error": line})
                    self._list_errors = parsed.errors
                self._listed = parsed
                try:
                    self._reconcile()
                except Exception:  # a bug here must not take the node's serving replicas down with it
                    log.exception("replica list not applied; the next answer tries again")
        return interval_s

    # -- 2. reconcile the replica list -----------------------------------------------------
    def _reconcile(self) -> None:
        """Carry out ``plan_replica_changes`` for the last list; called on every answer and
        whenever a local replica stops (its GPUs may be what a waiting entry needs)."""
        if self.draining or self._listed is None:
            return
        listed = self._listed
        plan = plan_replica_changes([m.view() for m in self.local.values()], listed.entries, self.gpus,
                                    listed.unparsed_ids)
        for rid in plan.forget:
            self.local.pop(rid, None)
            self._samples.pop(rid, None)
            log.info("replica forgotten (no longer listed)", extra={"replica": rid})
        for entry, why in plan.refuse:
            log.error("replica refused: not started", extra={"replica": entry.id, "gpus": list(entry.gpu_ids),
                                                             "node_gpus": self.gpus, "error": why})
            self._add_record(entry, FAILED, error=why)
        for entry in plan.acknowledge:  # "stopped" entries this agent never ran: say so, so they can close
            self._add_record(entry, STOPPED)
        for rid, deadline_s in plan.drain:
            self._drain_one(self.local[rid], deadline_s)
        for rid, deadline_s in plan.deadlines:
            m = self.local[rid]
            stricter = time.monotonic() + deadline_s
            if stricter < m.drain_deadline:
                m.drain_deadline = stricter
                m.deadline_changed.set()
        for entry in plan.start:
            self._waiting.discard(entry.id)
            self._start_one(entry)
        for entry in plan.wait:
            if entry.id not in self._waiting:
                holders = [m.replica.id for m in self.local.values()
                           if m.holds_gpus and set(m.replica.gpu_ids) & set(entry.gpu_ids)]
                log.info("replica waits for its GPUs", extra={"replica": entry.id, "gpus": list(entry.gpu_ids),
                                                             "held_by": holders})
        self._waiting = {e.id for e in plan.wait}
        if plan:
            self._spawn_task(self._report_replicas())

    def _add_record(self, entry: ReplicaEntry, state: str, error: str | None = None) -> LocalReplica:
        """A replica with no engine (refused, or stopped before it ever ran): reported, never started."""
        port = entry.port or 0
        replica = build_replica(entry.slot if entry.gpu_ids else 0, [], {}, self.advertise, port, entry.gpu_ids,
                                self.options.state_dir, replica_id=entry.id)
        replica.state, replica.error = state, error
        m = LocalReplica(entry, replica)
        self.local[entry.id] = m
        return m

    # -- 3. artifacts and engines ----------------------------------------------------------
    def _engine_kind(self) -> str:
        return template.choose_engine(self.options.engine or self.engine, self.gpus)

    async def _evict_cached(self, fetched: str) -> None:
        """Keep the local model cache within its share of the disk: the least recently used
        checkpoints that no replica here runs (nor the one just fetched) go, and are no longer
        reported, so placement stops counting on them."""
        local_cache = self._model_cache()
        try:
            limit = int(shutil.disk_usage(local_cache).total * self.options.model_cache_max_fraction)
            keep = {m.entry.model_path for m in self.local.values()} | {fetched}
            evicted = await asyncio.to_thread(artifacts.evict, local_cache, max_bytes=limit, keep=keep)
        except OSError as exc:
            log.warning("model cache eviction failed", extra={"error": repr(exc)})
            return
        for model_path in evicted:
            log.info("model cache: evicted", extra={"model_path": model_path})
            self._artifacts.pop(model_path, None)
            for key in [k for k in self._fetches if k[0] == model_path]:
                del self._fetches[key]  # a later replica fetches it again

    def remember_cached(self) -> None:
        """What the node's local cache already holds (fetched by an earlier agent process on this
        disk) counts as fetched: the heartbeat reports it, and its replicas start without a download."""
        for model_path in artifacts.cached(self._model_cache()):
            self._artifacts.setdefault(model_path, {"source": "local_cache", "download_s": 0.0})

    def _model_cache(self) -> Path:
        """The node-local model cache: the config's directory, or one in the state dir."""
        path = Path(self.config.model_cache_dir)
        try:
            path.mkdir(parents=True, exist_ok=True)
            return path
        except OSError:  # e.g. a local "node" cannot write /var/lib: keep the cache in the state dir
            return self.options.state_dir / "models"

    def _start_one(self, entry: ReplicaEntry) -> None:
        o = self.options
        engine = self._engine_kind()
        port = engine_port(entry, o.engine_port_base) or _free_port(o.host)
        replica = build_replica(entry.slot, [], template.engine_env(engine, entry.gpu_ids), self.advertise, port,
                                entry.gpu_ids, o.state_dir, replica_id=entry.id)
        m = LocalReplica(entry, replica)
        self.local[entry.id] = m
        log.info("starting replica", extra={"replica": entry.id, "pool": entry.pool_id, "model": entry.served_model_name,
                                            "engine": engine, "gpus": list(entry.gpu_ids), "port": port})
        m.task = self._spawn_task(self._run_replica(m, engine))

    async def _fetch(self, entry: ReplicaEntry) -> artifacts.Fetched:
        """The entry's artifacts, fetched once per model path on this node: replicas of one model
        started together share one download; a later one finds the local cache."""
        source = entry.artifact_source or self.config.artifact_source
        key = (entry.model_path, source)
        task = self._fetches.get(key)
        if task is not None and task.done() and (task.cancelled() or task.exception() is not None):
            task = None  # a failed fetch is tried again by the next replica
        already, created = task is not None and task.done(), task is None
        if created:
            local_cache = self._model_cache()
            task = asyncio.create_task(asyncio.to_thread(
                artifacts.fetch, entry.model_path, local_cache_dir=local_cache,
                shared_cache_dir=self.options.shared_cache_dir, source=source))
            self._fetches[key] = task
        try:
            fetched = await asyncio.shield(task)  # one replica cancelled does not cancel the others' fetch
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.error("artifact fetch failed; the engine gets the path as it is",
                      extra={"model_path": entry.model_path, "error": repr(exc)})
            return artifacts.Fetched(entry.model_path, "engine", 0.0)
        if created:
            log.info("artifacts ready", extra={"model_path": entry.model_path, "path": fetched.path,
                                               "source": fetched.source, "download_s": round(fetched.download_s, 3)})
            self._artifacts[entry.model_path] = {"source": fetched.source, "download_s": round(fetched.download_s, 3)}
            if fetched.download_s > 0:
                await self._evict_cached(entry.model_path)
        # A later replica finds the weights where the first fetch put them (for "engine", the
        # engine's own hub cache on this node, filled by the first replica's load).
        return replace(fetched, download_s=0.0, on_node=True) if already else fetched

    async def _run_replica(self, m: LocalReplica, engine: str) -> None:
        o, e, r = self.options, m.entry, m.replica
        try:
            fetched = await self._fetch(e)
            if self.draining or m.drain_task is not None:
                r.state = STOPPED
                return
            spec = template.EngineSpec(
                model_path=fetched.path, served_model_name=e.served_model_name, tp_size=e.tp_size,
                quantization=e.quantization, context_length=e.context_length, engine_args=e.engine_args,
                extra_args=tuple(self.config.engine_args) + (sim_args(o.sim_args, fetched) if engine == "sim" else ()))
            r.argv = template.engine_command(spec, engine=engine, python=o.python, host=o.host, port=r.port)
            m.supervisor = Supervisor(r, self.http, self._on_replica_change, self._sup_options, fetched.download_s)
            await m.supervisor.run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("replica failed", extra={"replica": r.id, "slot": r.slot})
            if m.supervisor is not None:
                with contextlib.suppress(Exception):
                    await m.supervisor.stop()
            r.state, r.error = FAILED, repr(exc)[:500]
            await self._report_replicas()
            self._reconcile()

    async def _on_replica_change(self, replica: Replica, event: str) -> None:
        if event == "ready":
            for phase, seconds in replica.ready_times.breakdown().items():
                self.metrics.model_ready.labels(phase).observe(seconds)
        elif event in ("restarting", "unresponsive"):
            self.metrics.restarts.labels(str(replica.slot)).inc()
            if event == "unresponsive":
                self.metrics.hangs.labels(str(replica.slot)).inc()
        self._samples.pop(replica.id, None)  # counters restart with the engine
        await self._report_replicas()
        if event == "failed":
            self._reconcile()  # its GPUs are free again

    # -- reports ---------------------------------------------------------------------------
    def _report_bodies(self) -> tuple[list[dict], list[tuple[LocalReplica, str]]]:
        locals_ = list(self.local.values())
        return [m.replica.report() for m in locals_], [(m, m.replica.state) for m in locals_]

    @staticmethod
    def _reported(sent: list[tuple[LocalReplica, str]]) -> None:
        for m, state in sent:
            m.reported_state = state

    async def _report_replicas(self, force: bool = False) -> bool:
        """Tell the control plane about replica states now (best effort: the next heartbeat repeats it).
        False when the report was lost to a transient failure and is worth repeating.

        Reports never queue up: while heartbeats fail (the control plane is down) none is sent on its
        own, and one already waiting for the lock sends the latest states for every caller after it.
        So a control plane that comes back gets one heartbeat, not a backlog. ``force`` (the drain's
        final report) sends regardless."""
        self.metrics.observe_replicas([r.state for r in self.replicas])
        if not force:
            if self._cp_down_since is not None:
                return False  # the next heartbeat carries it
            if self._report_waiting:
                return True
        self._report_waiting = True
        try:
            await self._report_lock.acquire()
        finally:  # a caller cancelled while waiting must not leave the others believing it will send
            self._report_waiting = False
        try:
            body, sent = self._report_bodies()
            try:
                await self.client.report_replicas(body)
            except Unauthorized as exc:
                log.error("credential refused while reporting replicas", extra={"error": str(exc)})
                self._begin_drain(0.0, "credential refused")  # no retry can fix that
            except (httpx.HTTPError, ValueError) as exc:
                log.warning("replica report failed; the next heartbeat repeats it", extra={"error": _describe(exc)})
                return False
            else:
                self._reported(sent)
            return True
        finally:
            self._report_lock.release()

    FINAL_REPORT_ATTEMPTS = 5

    async def _report_final(self) -> None:
        """The "every replica stopped" report lets the control plane terminate this node at once, and
        no heartbeat follows it: a lost one would leave the node to its drain deadline or the stale
        sweep (which records it as failed). So it is retried a few times, backing off."""
        delay = 0.5
        for attempt in range(1, self.FINAL_REPORT_ATTEMPTS + 1):
            if await self._report_replicas(force=True):
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

    async def _probe_in_flight(self, r: Replica) -> int | None:
        """Running plus queued requests on one engine now (0 once its process is gone; None when it
        cannot be read). Does not touch the heartbeat's samples, so no counter delta is lost."""
        if r.pid is None:
            return 0
        try:
            resp = await self.http.get(r.url + "/metrics", timeout=3.0)
            if resp.status_code != 200:
                return None
            return scrape.in_flight(scrape.parse(resp.text))
        except (httpx.HTTPError, ValueError):
            return None

    def in_flight(self) -> int:
        return sum(scrape.in_flight(self._samples[r.id]) for r in self.replicas
                   if r.id in self._samples and r.pid is not None)

    def node_metrics(self) -> dict:
        return {
            "engine": self._engine_kind(),
            "gpus": self.gpus,
            "replicas": len(self.local),
            "replicas_ready": sum(r.state == READY for r in self.replicas),
            "replicas_waiting": len(self._waiting),
            "gpus_in_use": sorted({g for m in self.local.values() if m.holds_gpus for g in m.replica.gpu_ids}),
            "restarts": sum(r.restarts for r in self.replicas),
            "last_restart": self._last_restart(),
            "in_flight": self.in_flight(),
            "uptime_s": round(time.monotonic() - self._started, 1),
            "draining": self.draining,
            "artifacts": dict(self._artifacts),
            "agent_version": VERSION,
        }

    def _last_restart(self) -> dict | None:
        """The node's latest engine restart and why (a crash, or a hang the probes caught)."""
        restarted = [r for r in self.replicas if r.last_restart_at is not None]
        if not restarted:
            return None
        r = max(restarted, key=lambda r: r.last_restart_at)
        return {"replica_id": r.id, "slot": r.slot, "at": r.last_restart_at.isoformat(),
                "reason": r.last_restart_reason, "exit_code": r.last_exit_code}

    async def _heartbeat_loop(self, interval_s: float) -> None:
        """Beat every ``interval_s``. A beat that fails is not queued: the next one, after a capped,
        jittered backoff, carries the state as it is then. The engines keep serving what they were
        last told whatever happens here; only the control plane's word (a command, a changed list,
        a refused credential) changes what runs."""
        while not self._done.is_set():
            await self._scrape()
            delivered = False
            try:
                async with self._report_lock:
                    reports, sent = self._report_bodies()
                    body = {"draining": self.draining, "agent_url": self.agent_url,
                            "node_metrics": self.node_metrics(), "replicas": reports}
                    answer = await self.client.heartbeat(body)
                    self._reported(sent)
                delivered = True
                self.metrics.heartbeats.labels("ok").inc()
                self._control_plane_back()
                if isinstance(answer, dict):
                    interval_s = self._apply_answer(answer, interval_s)
                else:
                    log.warning("heartbeat answer is not an object; ignored", extra={"answer": repr(answer)[:300]})
            except Unauthorized as exc:
                delivered = True  # an answer, and a final one
                self.metrics.heartbeats.labels("refused").inc()
                log.error("credential refused; stopping engines", extra={"error": str(exc)})
                self._begin_drain(0.0, "credential refused")
            except (httpx.HTTPError, ValueError) as exc:
                self.metrics.heartbeats.labels("error").inc()
                wait_s = self._control_plane_failed(exc)
            if delivered:
                wait_s = interval_s
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait_s)
        if self._drain_task is not None:
            await self._drain_task

    def _control_plane_failed(self, exc: Exception) -> float:
        """One more failed call in a row: the wait before the next heartbeat."""
        now = time.monotonic()
        if self._cp_down_since is None:
            self._cp_down_since = now
        delay = self._cp_backoff.next_delay()
        self.metrics.cp_unreachable.set(1)
        log.warning("heartbeat failed; engines keep serving, retrying", extra={
            "error": _describe(exc), "attempt": self._cp_backoff.failures,
            "down_s": round(now - self._cp_down_since, 1), "delay_s": round(delay, 2)})
        return delay

    def _control_plane_back(self) -> None:
        if self._cp_down_since is not None:
            log.info("control plane reachable again", extra={
                "failed_heartbeats": self._cp_backoff.failures,
                "down_s": round(time.monotonic() - self._cp_down_since, 1)})
        self._cp_down_since = None
        self._cp_backoff.reset()
        self.metrics.cp_unreachable.set(0)

    def _apply(self, command: dict) -> None:
        kind = command.get("type")
        if kind == "drain":
            self._begin_drain(float(command.get("deadline_s", self.options.drain_deadline_s)), "control plane")
        elif kind == "stop":
            self._begin_drain(0.0, "control plane stop")
        else:
            log.warning("unknown command ignored", extra={"command": command})

    # -- 5. drain one replica --------------------------------------------------------------
    def _drain_one(self, m: LocalReplica, deadline_s: float | None) -> None:
        deadline_s = self.options.drain_deadline_s if deadline_s is None else deadline_s
        m.drain_deadline = time.monotonic() + max(0.0, deadline_s)
        if m.supervisor is not None:
            m.supervisor.begin_drain()  # reported draining by the reconcile's report, at once
        log.info("draining replica", extra={"replica": m.replica.id, "slot": m.replica.slot,
                                            "deadline_s": deadline_s})
        m.drain_task = self._spawn_task(self._drain_replica(m))

    async def _sleep_until(self, m: LocalReplica, until: float) -> None:
        """Sleep until ``until`` or until a stricter deadline arrives for ``m``."""
        m.deadline_changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(m.deadline_changed.wait(), max(0.0, until - time.monotonic()))

    async def _drain_replica(self, m: LocalReplica) -> None:
        r = m.replica
        if m.supervisor is None:  # still fetching its artifacts: nothing runs yet
            if m.task is not None and not m.task.done():
                m.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await m.task
            if m.supervisor is None:
                r.state = STOPPED if r.state != FAILED else FAILED
        if m.supervisor is not None:
            m.supervisor.begin_drain()
            if r.ready_at is not None:  # it took traffic: edges need a snapshot poll to stop sending
                grace_until = time.monotonic() + self.options.drain_grace_s
                while (until := min(m.drain_deadline, grace_until)) > time.monotonic():
                    await self._sleep_until(m, until)
                while time.monotonic() < m.drain_deadline:
                    if await self._probe_in_flight(r) == 0:
                        break
                    await self._sleep_until(m, min(m.drain_deadline, time.monotonic() + DRAIN_POLL_S))
            left = await self._probe_in_flight(r)
            log.info("replica drained" if left == 0 else "replica drain deadline passed",
                     extra={"replica": r.id, "in_flight": left})
            await m.supervisor.stop()
            if m.task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.wait_for(m.task, 10)
        self._samples.pop(r.id, None)
        log.info("replica stopped", extra={"replica": r.id, "slot": r.slot, "state": r.state})
        await self._report_replicas()
        self._reconcile()  # a waiting entry may want these GPUs

    async def _stop_local(self, m: LocalReplica) -> None:
        """Stop one replica now, whatever it is doing (node drain, shutdown)."""
        if m.supervisor is not None:
            await m.supervisor.stop()
        elif m.task is not None and not m.task.done():
            m.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await m.task
            if m.supervisor is not None:  # created just before the cancel landed
                await m.supervisor.stop()
        if m.replica.state in (STARTING, READY, DRAINING):
            m.replica.state = STOPPED

    # -- 6. drain the node -----------------------------------------------------------------
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
        for m in self.local.values():
            if m.supervisor is not None:
                m.supervisor.begin_drain()
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
            await asyncio.sleep(DRAIN_POLL_S)
        left = self.in_flight()
        log.info("drained" if left == 0 else "drain deadline passed", extra={"in_flight": left})
        await asyncio.gather(*(self._stop_local(m) for m in list(self.local.values())))
        await self._report_final()
        self._done.set()
        self._wake.set()

    # -- introspection ---------------------------------------------------------------------
    def status(self) -> dict:
        down = self._cp_down_since
        return {
            "node_id": self.node_id,
            "control_plane": {"reachable": down is None, "failed_heartbeats": self._cp_backoff.failures,
                              "down_s": None if down is None else round(time.monotonic() - down, 1)},
            "node_state": self.node_state,
            "draining": self.draining,
            "engine": self._engine_kind(),
            "agent_url": self.agent_url,
            "node_metrics": self.node_metrics(),
            "waiting": sorted(self._waiting),
            "replicas": [{**m.replica.report(), "pid": m.replica.pid, "port": m.replica.port,
                          "argv": m.replica.argv, "env": dict(m.replica.env), "log": str(m.replica.log_path),
                          "pool_id": m.entry.pool_id, "variant_id": m.entry.variant_id,
                          "served_model_name": m.entry.served_model_name,
                          "draining_alone": m.drain_task is not None}
                         for m in self.local.values()],
        }


def _describe(exc: Exception) -> str:
    """An error for the log: its kind and text, never a request's headers (they hold credentials)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__
