"""The control plane's agent API, client side (contract documented in controlplane/api/agents.py).

The node credential is kept in the agent's state dir (mode 0600) so a restarted agent resumes
with it: the bootstrap token is one-time and already spent.

Every call is safe to repeat, and the agent repeats any whose answer it did not get (a timeout, a
refused connection, a 5xx): a heartbeat and a replica report carry whole states, not changes, and a
register repeated with the same bootstrap token gets the same credential back (the control plane
keeps the token usable for a grace period until the credential has been used). Only a 401/403 is
final (:class:`Unauthorized`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import httpx

log = logging.getLogger("nimbus.agent.client")
BASE = "/internal/v1/agents"


class Unauthorized(Exception):
    """The control plane refused our token or credential (expired, used, revoked, node gone)."""


class ControlPlaneClient:
    def __init__(self, base_url: str, http: httpx.AsyncClient, credential_path: Path,
                 timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.http = http
        self.credential_path = credential_path
        self.credential: str | None = None

    def load_credential(self) -> str | None:
        try:
            self.credential = self.credential_path.read_text().strip() or None
        except FileNotFoundError:
            self.credential = None
        return self.credential

    def _store_credential(self, credential: str) -> None:
        self.credential_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.credential_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(credential)
        self.credential = credential

    async def _post(self, path: str, body: dict, *, auth: bool = True) -> dict:
        headers = {"Authorization": f"Bearer {self.credential}"} if auth and self.credential else {}
        resp = await self.http.post(self.base_url + BASE + path, json=body, headers=headers, timeout=self.timeout_s)
        if resp.status_code in (401, 403):
            raise Unauthorized(f"{path}: {resp.status_code} {resp.text[:200]}")
        resp.raise_for_status()
        return resp.json()

    async def register(self, node_id: str, bootstrap_token: str, facts: dict) -> dict:
        """Spend the bootstrap token; the answer holds the node credential and the replica list."""
        answer = await self._post("/register", {"node_id": node_id, "bootstrap_token": bootstrap_token, **facts},
                                  auth=False)
        self._store_credential(answer.pop("credential"))
        return answer

    async def resume(self, facts: dict) -> dict:
        """A restarted agent: same credential, fresh engines (the list names what to start again)."""
        return await self._post("/resume", facts)

    async def report_replicas(self, replicas: list[dict]) -> dict:
        return await self._post("/replicas", {"replicas": replicas})

    async def heartbeat(self, body: dict) -> dict:
        return await self._post("/heartbeat", body)
