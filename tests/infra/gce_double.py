"""GCE REST **test double**: a small loopback HTTP server speaking the slice of the
Compute Engine v1 API that ``infra.gcp`` uses, so the real ``google-cloud-compute``
client (REST transport) can be driven end to end without Google.

Implemented: instances insert/get/delete/list/aggregatedList (label filters),
zone operations get/wait, global and regional instance templates get, ``requestId`` idempotency, ``alreadyExists`` on duplicate
names, unknown instance templates, and injectable errors per zone, either as an HTTP
error on the insert call or as an error inside the zone operation (which is how GCE
reports ``ZONE_RESOURCE_POOL_EXHAUSTED``). Operations stay RUNNING for
``operation_polls`` polls before they finish, so callers must really wait on them.

Fidelity notes: shapes follow the public REST reference; this is not GCE, and only
what the adapter reads is modelled.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

_ZONE_PATH = re.compile(r"^/compute/v1/projects/(?P<project>[^/]+)/zones/(?P<zone>[^/]+)/(?P<rest>.+)$")
_AGGREGATED = re.compile(r"^/compute/v1/projects/(?P<project>[^/]+)/aggregated/instances$")
_TEMPLATE = re.compile(r"projects/[^/]+/(?:global|regions/[^/]+)/instanceTemplates/[^/]+$")
_LABEL_TERM = re.compile(r'labels\.(?P<key>[a-z0-9_-]+)\s*=\s*"(?P<value>[^"]*)"')


@dataclass
class InjectedError:
    """One failure to serve for inserts into ``zone``.

    ``where="operation"``: the insert is accepted and its operation ends DONE with
    ``error.errors[0].code == code`` (capacity and many quota errors look like this).
    ``where="http"``: the insert call itself fails with HTTP ``status`` and
    ``errors[0].reason == code``.
    """

    zone: str
    code: str
    message: str
    where: str = "operation"
    status: int = 503
    times: int = 1


class GceDouble:
    def __init__(self, project: str = "nimbus-test", *, operation_polls: int = 1) -> None:
        self.project = project
        self.operation_polls = operation_polls
        self.instances: dict[tuple[str, str], dict[str, Any]] = {}  # (zone, name) → resource
        self.operations: dict[tuple[str, str], dict[str, Any]] = {}  # (zone, op name) → op
        self.templates: dict[str, dict[str, Any]] = {}  # "projects/…/instanceTemplates/x" → properties
        self.requests: list[dict[str, Any]] = []
        self._by_request_id: dict[str, tuple[str, str]] = {}
        self._pending: dict[tuple[str, str], tuple[int, Any]] = {}  # op → (polls left, on_done)
        self._injected: list[InjectedError] = []
        self._ids = itertools.count(4_000_000_000_000_000_001)
        self._lock = threading.RLock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    # -- lifecycle -----------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> GceDouble:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    # -- test controls -------------------------------------------------------------
    def add_template(self, link: str, properties: dict[str, Any] | None = None) -> None:
        """Register a template (full self link or ``projects/…`` path) and its properties."""
        self.templates[_template_key(link)] = properties or {}

    def inject(self, error: InjectedError) -> None:
        with self._lock:
            self._injected.append(error)

    def preempt(self, zone: str, name: str) -> None:
        """What a spot preemption with termination action DELETE leaves behind: nothing."""
        with self._lock:
            self.instances.pop((zone, name), None)

    # -- request handling ----------------------------------------------------------
    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        double = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep pytest output clean
                pass

            def _serve(self, method: str) -> None:
                url = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}") if length else {}
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                status, payload = double.handle(method, url.path, query, body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def do_DELETE(self) -> None:
                self._serve("DELETE")

        return Handler

    def handle(self, method: str, path: str, query: dict[str, str], body: dict[str, Any]) -> tuple[int, Any]:
        with self._lock:
            self.requests.append({"method": method, "path": path, "query": query, "body": body})
            if m := _AGGREGATED.match(path):
                return self._aggregated(query)
            if method == "GET" and (m := _TEMPLATE.search(path)):
                props = self.templates.get(m[0])
                if props is None:
                    return _http_error(404, "notFound", f"The resource '{m[0]}' was not found")
                return 200, {"kind": "compute#instanceTemplate", "name": m[0].rsplit("/", 1)[-1], "properties": props}
            m = _ZONE_PATH.match(path)
            if not m or m["project"] != self.project:
                return _http_error(404, "notFound", f"no route for {method} {path}")
            zone, parts = m["zone"], m["rest"].split("/")
            match method, parts:
                case "POST", ["instances"]:
                    return self._insert(zone, query, body)
                case "GET", ["instances"]:
                    items = [i for (z, _), i in self.instances.items() if z == zone and _matches(i, query)]
                    return 200, {"kind": "compute#instanceList", "items": items}
                case "GET", ["instances", name]:
                    inst = self.instances.get((zone, name))
                    return (200, inst) if inst else _not_found(zone, name)
                case "DELETE", ["instances", name]:
                    return self._delete(zone, name)
                case "GET", ["operations", op]:
                    return self._poll(zone, op)
                case "POST", ["operations", op, "wait"]:
                    return self._poll(zone, op, finish=True)
            return _http_error(404, "notFound", f"no route for {method} {path}")

    def _insert(self, zone: str, query: dict[str, str], body: dict[str, Any]) -> tuple[int, Any]:
        request_id = query.get("requestId")
        if request_id and request_id in self._by_request_id:
            return 200, self.operations[self._by_request_id[request_id]]
        if injected := self._take_injected(zone):
            if injected.where == "http":
                return _http_error(injected.status, injected.code, injected.message)
            op = self._new_operation(zone, "insert", body.get("name", ""), request_id)
            self._pending[(zone, op["name"])] = (self.operation_polls, ("error", injected))
            return 200, op
        template = query.get("sourceInstanceTemplate")
        if template is not None and _template_key(template) not in self.templates:
            return _http_error(404, "notFound", f"The resource '{template}' was not found")
        name = body.get("name", "")
        if (zone, name) in self.instances:
            return _http_error(409, "alreadyExists", f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' already exists")
        resource = self._new_instance(zone, body, template)
        self.instances[(zone, name)] = resource
        op = self._new_operation(zone, "insert", name, request_id)
        self._pending[(zone, op["name"])] = (self.operation_polls, ("status", resource, "RUNNING"))
        return 200, op

    def _delete(self, zone: str, name: str) -> tuple[int, Any]:
        inst = self.instances.get((zone, name))
        if not inst:
            return _not_found(zone, name)
        inst["status"] = "STOPPING"
        op = self._new_operation(zone, "delete", name, None)
        self._pending[(zone, op["name"])] = (self.operation_polls, ("delete", name))
        return 200, op

    def _poll(self, zone: str, op_name: str, *, finish: bool = False) -> tuple[int, Any]:
        op = self.operations.get((zone, op_name))
        if not op:
            return _http_error(404, "notFound", f"operation {op_name} not found")
        key = (zone, op_name)
        if key in self._pending:
            polls, outcome = self._pending[key]
            # ``wait`` may return before DONE (GCE caps it at ~2 min); model that too.
            if polls > 1:
                self._pending[key] = (polls - 1, outcome)
            else:
                del self._pending[key]
                self._complete(zone, op, outcome)
        return 200, op

    def _complete(self, zone: str, op: dict[str, Any], outcome: tuple[Any, ...]) -> None:
        op["status"] = "DONE"
        op["progress"] = 100
        match outcome:
            case ("error", InjectedError() as err):
                op["error"] = {"errors": [{"code": err.code, "message": err.message}]}
                op["httpErrorStatusCode"] = err.status
            case ("status", resource, status):
                resource["status"] = status
            case ("delete", name):
                self.instances.pop((zone, name), None)

    def _take_injected(self, zone: str) -> InjectedError | None:
        for err in self._injected:
            if err.zone == zone and err.times > 0:
                err.times -= 1
                return err
        return None

    def _new_operation(self, zone: str, kind: str, target: str, request_id: str | None) -> dict[str, Any]:
        name = f"operation-{next(self._ids)}"
        base = f"{self.endpoint}/compute/v1/projects/{self.project}/zones/{zone}"
        op = {
            "kind": "compute#operation",
            "id": str(next(self._ids)),
            "name": name,
            "zone": base,
            "operationType": kind,
            "targetLink": f"{base}/instances/{target}",
            "status": "RUNNING",
            "progress": 0,
            "insertTime": _now(),
            "selfLink": f"{base}/operations/{name}",
        }
        self.operations[(zone, name)] = op
        if request_id:
            self._by_request_id[request_id] = (zone, name)
        return op

    def _new_instance(self, zone: str, body: dict[str, Any], template: str | None) -> dict[str, Any]:
        number = next(self._ids)
        resource = dict(body)
        nic = dict((body.get("networkInterfaces") or [{}])[0])
        nic["networkIP"] = f"10.{number % 250}.{(number // 250) % 250}.{number % 7 + 2}"
        resource.update(
            {
                "kind": "compute#instance",
                "id": str(number),
                "zone": f"{self.endpoint}/compute/v1/projects/{self.project}/zones/{zone}",
                "status": "PROVISIONING",
                "creationTimestamp": _now(),
                "networkInterfaces": [nic],
                "selfLink": f"{self.endpoint}/compute/v1/projects/{self.project}/zones/{zone}/instances/{body.get('name')}",
                "sourceInstanceTemplate": template,
            }
        )
        return resource

    def _aggregated(self, query: dict[str, str]) -> tuple[int, Any]:
        items: dict[str, Any] = {}
        for (zone, _), inst in self.instances.items():
            if _matches(inst, query):
                items.setdefault(f"zones/{zone}", {"instances": []})["instances"].append(inst)
        return 200, {"kind": "compute#instanceAggregatedList", "items": items}


def _template_key(link: str) -> str:
    m = _TEMPLATE.search(link)
    return m[0] if m else link


def _matches(instance: dict[str, Any], query: dict[str, str]) -> bool:
    """Supports the conjunction of ``labels.KEY = "VALUE"`` terms that the adapter sends."""
    labels = instance.get("labels", {})
    return all(labels.get(m["key"]) == m["value"] for m in _LABEL_TERM.finditer(query.get("filter", "")))


def _http_error(status: int, reason: str, message: str) -> tuple[int, Any]:
    return status, {
        "error": {"code": status, "message": message, "errors": [{"message": message, "domain": "global", "reason": reason}]}
    }


def _not_found(zone: str, name: str) -> tuple[int, Any]:
    return _http_error(404, "notFound", f"The resource 'projects/x/zones/{zone}/instances/{name}' was not found")


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")
