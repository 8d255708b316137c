"""``nimbus-agent`` / ``python -m dataplane.agent``: run the node agent.

    nimbus-agent --config /etc/nimbus/agent.json

The config is the file cloud-init writes (``infra.bootstrap.AgentConfig``). Tunables come from
``NIMBUS_AGENT_*`` variables (see ``config.AgentOptions``) or the flags below. Exit codes: 0
after a drain, 3 when the control plane refuses the node, 4 on a startup error.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from dataplane.agent import logs
from dataplane.agent.config import AgentOptions, load_config


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nimbus-agent", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, help="agent config (default: NIMBUS_AGENT_CONFIG or /etc/nimbus/agent.json)")
    p.add_argument("--state-dir", type=Path)
    p.add_argument("--port", type=int, help="the agent's own HTTP port (0: ephemeral)")
    p.add_argument("--heartbeat-s", type=float)
    p.add_argument("--log-level", default=os.environ.get("NIMBUS_AGENT_LOG_LEVEL", "info"))
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config, path = load_config(args.config)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"nimbus-agent: cannot read the agent config: {exc}", file=sys.stderr)
        return 4
    logs.configure(args.log_level, node=config.node_id)
    options = AgentOptions.from_env(config, path, state_dir=args.state_dir, port=args.port,
                                    heartbeat_s=args.heartbeat_s, log_level=args.log_level)
    from dataplane.agent.agent import NodeAgent

    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover
        runner = asyncio.run
    try:
        return runner(NodeAgent(config, options).run())
    except Exception:
        logging.getLogger("nimbus.agent").exception("agent failed")
        return 4


if __name__ == "__main__":
    raise SystemExit(main())
