"""One engine replica under supervision: start, wait for readiness, watch, restart with backoff.

Readiness has two steps, which also split the model-ready time: ``/health`` turning 200 ends
*load* (weights in GPU memory, server up), the first ``/health_generate`` 200 (a real one-token
generation) ends *warm-up* (CUDA graphs captured, kernels compiled). Only then is a replica
``ready`` and registered for traffic.

A ready engine is then probed with ``/health_generate`` every ``probe_interval_s``. SGLang answers
200 as soon as any request makes progress after the probe began (a busy engine passes within a
decode step; an idle one runs a one-token generation) and 503 after its own 20 s; a hung process
may not answer at all, so each probe also has a timeout. ``probe_failures`` failed probes in a row
restart the engine although its process lives, with the same backoff as a crash. Each restart
records why (``last_restart_reason``): the exit code or signal, or the failed probes.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx

log = logging.getLogger("nimbus.agent.engine")

STARTING, READY, DRAINING, STOPPED, FAILED = "starting", "ready", "draining", "stopped", "failed"


def restart_delay(consecutive_failures: int, base_s: float = 1.0, cap_s: float = 60.0) -> float:
    """Exponential backoff: 1 s, 2 s, 4 s … capped, so a crash-looping engine cannot hammer the GPU
    (or the artifact cache) while a one-off crash is back within a second."""
    if consecutive_failures <= 0:
        return 0.0
    return min(cap_s, base_s * 2 ** (consecutive_failures - 1))


def _engine_preexec() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Own process group (SGLang forks schedulers: stopping an engine signals the whole group), and
    if the agent dies, even by SIGKILL, its engines go too: nothing may hold a GPU unmanaged."""
    os.setpgid(0, 0)
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class ReadyTimes:
    download_s: float = 0.0
    load_s: float = 0.0
    warmup_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.download_s + self.load_s + self.warmup_s

    def breakdown(self) -> dict[str, float]:
        return {"download": round(self.download_s, 3), "load": round(self.load_s, 3),
                "warmup": round(self.warmup_s, 3)}


@dataclass
class SupervisorOptions:
    ready_timeout_s: float = 1800.0  # a 70B checkpoint can take minutes to load
    poll_s: float = 0.1
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 60.0
    stable_after_s: float = 120.0  # a replica up this long has its failure streak forgotten
    max_consecutive_failures: int = 8
    stop_grace_s: float = 15.0
    probe_interval_s: float = 10.0  # 0: no liveness probes
    probe_timeout_s: float = 25.0  # above SGLang's own 20 s /health_generate limit, so its 503 comes first
    probe_failures: int = 3  # 0: no liveness probes
    kill_grace_s: float = 2.0  # SIGTERM → SIGKILL for an engine being restarted

    def unresponsive_within_s(self) -> float:
        """The longest a hung ready engine is left before it is killed for a restart."""
        return self.probe_failures * (self.probe_interval_s + self.probe_timeout_s) + self.kill_grace_s + 5.0


@dataclass
class Replica:
    """One engine process and what the control plane is told about it. ``id`` is the control
    plane's (the replica list names it); ``slot`` a small number stable for the replica's life on
    this node (its lowest GPU index)."""

    slot: int
    argv: list[str]
    env: Mapping[str, str]
    port: int
    url: str
    gpu_ids: list[int]
    log_path: Path
    id: str = field(default_factory=lambda: str(uuid.uuid4()))
    state: str = STARTING
    restarts: int = 0
    consecutive_failures: int = 0
    last_exit_code: int | None = None
    last_restart_at: datetime | None = None
    started_at: datetime | None = None
    ready_at: datetime | None = None
    ready_times: ReadyTimes = field(default_factory=ReadyTimes)
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    metrics: dict = field(default_factory=dict)
    error: str | None = None  # why it failed without running (e.g. a GPU the node does not have)
    last_restart_reason: str | None = None  # why the engine was last restarted (exit, signal, hang)
    proc: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc and self.proc.returncode is None else None

    def report(self) -> dict:
        """The replica as the agent API's ``replicas[]`` entry."""
        out = {
            "id": self.id,
            "slot": self.slot,
            "state": self.state,
            "url": self.url,
            "gpu_ids": list(self.gpu_ids),
            "restarts": self.restarts,
            "last_exit_code": self.last_exit_code,
            "last_restart_at": self.last_restart_at.isoformat() if self.last_restart_at else None,
            "last_restart_reason": self.last_restart_reason,
            "started_at": self.started_at.isoformat() if self.started_at else None,
            "ready_at": self.ready_at.isoformat() if self.ready_at else None,
            "model_ready_seconds": round(self.ready_times.total_s, 3) if self.ready_at else None,
            "ready_breakdown": self.ready_times.breakdown() if self.ready_at else {},
            "max_running_requests": self.max_running_requests,
            "max_total_tokens": self.max_total_tokens,
            "metrics": self.metrics,
        }
        if self.error:
            out["error"] = self.error
        return out


Notify = Callable[[Replica, str], Awaitable[None]]


class Supervisor:
    """Keeps one replica running until ``stop()``; every state change is passed to ``notify``."""

    def __init__(self, replica: Replica, http: httpx.AsyncClient, notify: Notify,
                 options: SupervisorOptions | None = None, download_s: float = 0.0) -> None:
        self.replica = replica
        self.http = http
        self.notify = notify
        self.options = options or SupervisorOptions()
        self._first_download_s = download_s
        self._stopping = asyncio.Event()
        self._log_file = None
        self.draining = False

    # -- lifecycle ---------------------------------------------------------------------
    async def run(self) -> None:
        try:
            await self._run()
        finally:
            if self._stopping.is_set():
                # stop() may have come while a spawn was under way (it found no process to
                # kill): the engine that spawn started must not outlive its replica.
                await self._kill(self.options.stop_grace_s)
                self.replica.state = STOPPED
                self._close_log()

    async def _run(self) -> None:
        r, o = self.replica, self.options
        download_s = self._first_download_s
        while not self._stopping.is_set():
            await self._spawn()
            ready = await self._wait_ready(download_s)
            download_s = 0.0  # the cache holds the weights from now on
            up_since = time.monotonic()
            hung = await self._watch() if ready else None
            if self._stopping.is_set() or self.draining:
                break  # a draining replica that dies is not brought back
            exited_on_its_own = r.proc is not None and r.proc.returncode is not None
            await self._kill(o.kill_grace_s)
            r.last_exit_code = r.proc.returncode if r.proc else None
            if hung:
                r.last_restart_reason = hung
            elif exited_on_its_own:
                r.last_restart_reason = _exit_reason(r.last_exit_code, ready)
            else:
                r.last_restart_reason = f"not ready within {o.ready_timeout_s:g} s"
            if ready and time.monotonic() - up_since >= o.stable_after_s:
                r.consecutive_failures = 0
            r.consecutive_failures += 1
            r.restarts += 1
            r.last_restart_at = datetime.now(UTC)
            r.metrics = {}
            if r.consecutive_failures > o.max_consecutive_failures:
                r.state = FAILED
                log.error("engine gave up", extra={"replica": r.id, "slot": r.slot, "restarts": r.restarts,
                                                    "exit_code": r.last_exit_code})
                await self.notify(r, "failed")
                return
            delay = restart_delay(r.consecutive_failures, o.backoff_base_s, o.backoff_cap_s)
            r.state = STARTING
            log.warning("engine unresponsive; restarting" if hung else "engine exited; restarting", extra={
                "replica": r.id, "slot": r.slot, "exit_code": r.last_exit_code, "restarts": r.restarts,
                "delay_s": delay, "was_ready": ready, "reason": r.last_restart_reason})
            await self.notify(r, "unresponsive" if hung else "restarting")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)

    def begin_drain(self) -> None:
        """No new traffic from now on; a crash during the drain ends the replica instead of restarting it."""
        self.draining = True
        if self.replica.state in (STARTING, READY):
            self.replica.state = DRAINING

    async def stop(self) -> None:
        """Stop for good (drain or shutdown): SIGTERM, then SIGKILL after the grace period."""
        self._stopping.set()
        await self._kill(self.options.stop_grace_s)
        if self.replica.proc is not None and self.replica.last_exit_code is None:
            self.replica.last_exit_code = self.replica.proc.returncode
        self.replica.state = STOPPED
        self._close_log()

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    # -- steps -------------------------------------------------------------------------
    async def _spawn(self) -> None:
        r = self.replica
        r.state = DRAINING if self.draining else STARTING
        r.ready_at = None
        r.started_at = datetime.now(UTC)
        r.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self._log_file is None:
            self._log_file = open(r.log_path, "ab")  # noqa: ASYNC230 - once per replica, kept open across restarts
        r.proc = await asyncio.create_subprocess_exec(
            *r.argv, env={**os.environ, **r.env}, stdin=asyncio.subprocess.DEVNULL, stdout=self._log_file,
            stderr=asyncio.subprocess.STDOUT, preexec_fn=_engine_preexec,
        )
        log.info("engine started", extra={"replica": r.id, "slot": r.slot, "pid": r.proc.pid, "port": r.port,
                                           "gpus": r.gpu_ids, "argv": r.argv})

    async def _poll(self, path: str, deadline: float, request_timeout_s: float = 5.0) -> bool:
        """Until ``path`` answers 200; False if the process died or the deadline passed first."""
        r = self.replica
        while time.monotonic() < deadline and not self._stopping.is_set():
            if r.proc is None or r.proc.returncode is not None:
                return False
            try:
                resp = await self.http.get(r.url + path, timeout=request_timeout_s)
                if resp.status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            await asyncio.sleep(self.options.poll_s)
        return False

    async def _wait_ready(self, download_s: float) -> bool:
        r = self.replica
        t0 = time.monotonic()
        deadline = t0 + self.options.ready_timeout_s
        if not await self._poll("/health", deadline):
            return False
        t1 = time.monotonic()
        # SGLang's /health_generate runs a real generation and waits up to 20 s for it.
        if not await self._poll("/health_generate", deadline, request_timeout_s=30.0):
            return False
        t2 = time.monotonic()
        r.ready_times = ReadyTimes(download_s, t1 - t0, t2 - t1)
        await self._read_capacity()
        r.state = DRAINING if self.draining else READY
        r.ready_at = datetime.now(UTC)
        log.info("engine ready", extra={"replica": r.id, "slot": r.slot, **r.ready_times.breakdown()})
        await self.notify(r, "ready")
        return True

    async def _read_capacity(self) -> None:
        """Batch and KV capacity from ``/get_server_info`` (the edge's concurrency guard needs them)."""
        r = self.replica
        try:
            resp = await self.http.get(r.url + "/get_server_info", timeout=5.0)
            info = resp.json() if resp.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            info = {}
        # SGLang reports the computed capacity as max_total_num_tokens next to the server args. Its
        # max_running_requests server arg is null unless the flag was given; the cap the scheduler
        # computed is each DP rank's internal_states[].effective_max_running_requests_per_dp.
        r.max_total_tokens = info.get("max_total_num_tokens") or info.get("max_total_tokens") or None
        states = info.get("internal_states") or [{}]
        per_dp = states[0].get("effective_max_running_requests_per_dp") if isinstance(states[0], dict) else None
        r.max_running_requests = info.get("max_running_requests") or per_dp or None

    async def _wait_exit(self, timeout_s: float | None = None, also: asyncio.Future | None = None) -> bool:
        """Until the engine exits or ``stop()`` is called (True), or ``timeout_s`` passes or ``also``
        completes first (False)."""
        r = self.replica
        assert r.proc is not None
        stop = asyncio.ensure_future(self._stopping.wait())
        exited = asyncio.ensure_future(r.proc.wait())
        waiting = {stop, exited} | ({also} if also is not None else set())
        try:
            await asyncio.wait(waiting, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            exited.cancel()
        return self._stopping.is_set() or r.proc.returncode is not None

    async def _watch(self) -> str | None:
        """While the ready engine lives: probe it every ``probe_interval_s``. Returns None once it
        exits or is stopped, or the restart reason once ``probe_failures`` probes in a row failed."""
        r, o = self.replica, self.options
        if o.probe_failures <= 0 or o.probe_interval_s <= 0:
            await self._wait_exit()
            return None
        failures, first_failed_at, why = 0, 0.0, ""
        while True:
            if await self._wait_exit(o.probe_interval_s):
                return None
            if self.draining:  # SGLang answers 503 while it drains; the drain deadline bounds it
                failures = 0
                continue
            probe = asyncio.ensure_future(self._probe())
            if await self._wait_exit(o.probe_timeout_s + 1.0, also=probe):
                probe.cancel()
                return None
            if not probe.done():
                probe.cancel()
                ok, why = False, f"no answer in {o.probe_timeout_s:g} s"
            else:
                ok, why = probe.result()
            if self.draining:
                continue
            if ok:
                if failures:
                    log.info("engine answers probes again", extra={"replica": r.id, "slot": r.slot,
                                                                   "failed_probes": failures})
                failures = 0
                continue
            failures += 1
            if failures == 1:
                first_failed_at = time.monotonic()
            log.warning("engine probe failed", extra={"replica": r.id, "slot": r.slot, "failed_probes": failures,
                                                       "of": o.probe_failures, "error": why})
            if failures >= o.probe_failures:
                over = time.monotonic() - first_failed_at + o.probe_timeout_s
                return (f"unresponsive: /health_generate failed {failures} times in a row over {over:.1f} s "
                        f"({why}) while the process lived")

    async def _probe(self) -> tuple[bool, str]:
        r, o = self.replica, self.options
        try:
            resp = await self.http.get(r.url + "/health_generate", timeout=o.probe_timeout_s)
        except httpx.TimeoutException:
            return False, f"no answer in {o.probe_timeout_s:g} s"
        except httpx.HTTPError as exc:
            return False, type(exc).__name__
        return (True, "") if resp.status_code == 200 else (False, f"HTTP {resp.status_code}")

    async def _kill(self, grace_s: float = 2.0) -> None:
        """SIGTERM the engine's process group (SGLang forks schedulers), SIGKILL after ``grace_s``."""
        proc = self.replica.proc
        if proc is None or proc.returncode is not None:
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                await asyncio.wait_for(proc.wait(), wait)
                return
            except TimeoutError:
                continue


def _exit_reason(code: int | None, was_ready: bool) -> str:
    when = "" if was_ready else " before it was ready"
    if code is None:
        return f"exited{when}"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}{when}"
        return f"killed by signal {-code}{when}"
    return f"exited with code {code}{when}"


def build_replica(slot: int, argv: Sequence[str], env: Mapping[str, str], host: str, port: int,
                  gpu_ids: Sequence[int], log_dir: Path, replica_id: str | None = None) -> Replica:
    rid = replica_id or str(uuid.uuid4())
    return Replica(slot=slot, argv=list(argv), env=dict(env), port=port, url=f"http://{host}:{port}",
                   gpu_ids=list(gpu_ids), log_path=log_dir / f"engine-{slot}-{rid[:8]}.log", id=rid)
