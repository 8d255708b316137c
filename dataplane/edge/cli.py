"""``nimbus-edge`` / ``python -m dataplane.edge``: run the edge proxy.

Standalone: ``nimbus-edge --config edge.json`` (format in ``standalone.py``).
With a control plane: ``nimbus-edge --control-plane-url URL`` and the edge token in
``NIMBUS_EDGE_TOKEN`` (never on the command line, where ``ps`` would show it).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from dataplane.edge.settings import EdgeSettings


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nimbus-edge", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--config", type=Path, help="standalone config file (JSON)")
    src.add_argument("--control-plane-url", help="control plane base URL (or NIMBUS_CONTROL_PLANE_URL)")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--state-dir", type=Path, help="where the last snapshot and the usage spool live")
    p.add_argument("--redis-url", help="Redis for limits and the usage stream; 'none' to run without")
    p.add_argument("--policy", choices=("predicted_ttft", "least_load", "round_robin"))
    p.add_argument("--region", help="the region this edge runs in")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override any setting, e.g. --set queue_timeout_s=5 (repeatable)")
    p.add_argument("--log-level", default=os.environ.get("NIMBUS_EDGE_LOG_LEVEL", "warning"))
    return p


def resolve(args: argparse.Namespace, environ: dict[str, str] | None = None):
    """Settings and the source factory from (config file settings) < env < CLI flags."""
    from dataplane.edge.snapshot import ControlPlaneSource, StaticSource
    from dataplane.edge.standalone import config_to_snapshot, load_config

    environ = dict(os.environ if environ is None else environ)
    settings = EdgeSettings()
    config = None
    if args.config:
        config = load_config(args.config)
        settings = settings.merged(config.get("settings") or {})
    settings = settings.with_env(environ)
    overrides = {k: getattr(args, k) for k in ("host", "port", "state_dir", "policy", "region",
                                                "control_plane_url")}
    overrides["redis_url"] = args.redis_url  # the string "none" turns Redis off
    for item in args.set:
        name, _, value = item.partition("=")
        if name not in EdgeSettings.field_names():
            raise SystemExit(f"unknown setting {name!r}")
        overrides[name] = value
    settings = settings.merged(overrides)
    if "NIMBUS_EDGE_TOKEN" in environ:
        settings = settings.merged({"edge_token": environ["NIMBUS_EDGE_TOKEN"]})

    if config is not None:
        snapshot = config_to_snapshot(config)

        def factory(service):
            return StaticSource(snapshot, service.on_snapshot)
    elif settings.control_plane_url:
        def factory(service):
            return ControlPlaneSource(settings.control_plane_url, settings.edge_token, settings.state_dir,
                                      service.on_snapshot, settings.snapshot_poll_s)
    else:
        raise SystemExit("nimbus-edge needs --config FILE or --control-plane-url URL (or NIMBUS_CONTROL_PLANE_URL)")
    return settings, factory


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings, factory = resolve(args)

    import uvloop

    from dataplane.edge.app import EdgeApp
    from dataplane.edge.service import EdgeService

    app = EdgeApp(EdgeService(settings, factory))
    uvloop.run(app.serve_forever(settings.host, settings.port))


if __name__ == "__main__":
    main()
