"""``nimbus-sim`` / ``python -m dataplane.sim``: start one simulated SGLang engine."""

from __future__ import annotations

import asyncio
import logging
import sys

from .config import parse_config
from .server import SimServer


def main(argv: list[str] | None = None) -> int:
    config, ready_delay = parse_config(sys.argv[1:] if argv is None else argv)
    level = getattr(logging, config.log_level.upper(), logging.INFO)
    logging.basicConfig(level=level, format="[%(asctime)s] %(levelname)s %(name)s: %(message)s")
    logging.getLogger("nimbus.sim").info(
        "simulating %s (%s) on %dx%s (GPU ids %s), %s, KV capacity %d tokens, max running %d, ready in %.1fs, "
        "time scale %g, listening on http://%s:%d",
        config.served_model_name, config.model.name, config.tp_size, config.gpu.name, config.gpu_ids or "none",
        config.quantization or "bf16", config.max_total_tokens, config.max_running_requests, ready_delay,
        config.time_scale, config.host, config.port,
    )
    try:
        import uvloop  # a faster event loop where available; the simulator runs without it too

        run = uvloop.run
    except ImportError:
        run = asyncio.run
    run(SimServer(config, ready_delay).serve_forever())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
