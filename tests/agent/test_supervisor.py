"""The supervisor's stop, raced against a start: an engine spawned while ``stop()`` ran must not
outlive its replica (a per-replica drain can stop a replica the moment it was started)."""

from __future__ import annotations

import asyncio
import sys

import httpx

from dataplane.agent.engine import STOPPED, Supervisor, SupervisorOptions, build_replica


def test_stop_during_spawn_leaves_no_engine_behind(tmp_path):
    async def main() -> list[int | None]:
        codes = []
        async with httpx.AsyncClient() as http:
            for i in range(5):
                replica = build_replica(0, [sys.executable, "-c", "import time; time.sleep(60)"], {}, "127.0.0.1",
                                        1, [0], tmp_path, replica_id=f"r-{i}")

                async def notify(_replica, _event) -> None:
                    return None

                sup = Supervisor(replica, http, notify, SupervisorOptions(stop_grace_s=2.0))
                task = asyncio.create_task(sup.run())
                for _ in range(i):  # stop at a different point of the spawn each round
                    await asyncio.sleep(0)
                await sup.stop()
                await asyncio.wait_for(task, 10)
                assert replica.state == STOPPED and replica.pid is None
                codes.append(replica.proc.returncode if replica.proc else None)
        return codes

    codes = asyncio.run(main())
    assert all(code is None or code != 0 for code in codes)  # never spawned, or killed: none ran to its end
