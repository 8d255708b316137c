"""TEST DOUBLE for ``python -m sglang.launch_server`` (not SGLang; see ../README.md).

1. Records what it was started with (argv, ``CUDA_VISIBLE_DEVICES`` and the rest of the
   environment's ``CUDA_*``/``NIMBUS_*`` variables, its pid) as one JSON line appended to the file
   named by ``NIMBUS_SGLANG_STANDIN_RECORD``.
2. Refuses, as SGLang's argparse would (exit code 2), any flag that SGLang's ``ServerArgs.add_cli_args``
   does not define: a misspelt flag in the agent's command template would keep a real GPU node
   from ever starting, and this is where a CPU-only test can catch it.
3. Serves through the simulator: ``exec python -m dataplane.sim <the same argv>
   $NIMBUS_SGLANG_STANDIN_SIM_ARGS``.

The flag list below holds the SGLang flags the node agent can emit (its template, and the
engine_args the control plane's variants use in tests), each checked against SGLang's
``python/sglang/srt/server_args.py`` (see dataplane/sim/CONFORMANCE.md, "Launch flags").
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time

# name -> takes a value (True) or is a store_true switch (False)
SGLANG_FLAGS: dict[str, bool] = {
    "--model-path": True, "--model": True, "--tokenizer-path": True, "--host": True, "--port": True,
    "--tp-size": True, "--tp": True, "--dp-size": True, "--dp": True, "--mem-fraction-static": True,
    "--max-running-requests": True, "--max-queued-requests": True, "--max-total-tokens": True,
    "--chunked-prefill-size": True, "--max-prefill-tokens": True, "--schedule-policy": True,
    "--schedule-conservativeness": True, "--enable-priority-scheduling": False, "--page-size": True,
    "--disable-radix-cache": False, "--quantization": True, "--kv-cache-dtype": True, "--dtype": True,
    "--context-length": True, "--served-model-name": True, "--api-key": True, "--enable-metrics": False,
    "--enable-cache-report": False, "--stream-interval": True, "--log-level": True, "--log-requests": False,
    "--trust-remote-code": False, "--enable-torch-compile": False, "--cuda-graph-max-bs": True,
    "--disable-cuda-graph": False, "--attention-backend": True, "--random-seed": True,
    "--watchdog-timeout": True, "--download-dir": True, "--load-format": True, "--skip-server-warmup": False,
    "--base-gpu-id": True, "--revision": True, "--chat-template": True,
}
SCHEDULE_POLICIES = ("lpm", "random", "fcfs", "dfs-weight", "lof", "priority", "hrrn", "shortest-prefill-first",
                     "routing-key")


def check(argv: list[str]) -> str | None:
    """The first problem SGLang's parser would report, or None."""
    i = 0
    while i < len(argv):
        token = argv[i]
        name = token.split("=", 1)[0]
        if not name.startswith("--") or name not in SGLANG_FLAGS:
            return f"unrecognized arguments: {token}"
        if SGLANG_FLAGS[name] and "=" not in token:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                return f"argument {name}: expected one argument"
            if name == "--schedule-policy" and argv[i + 1] not in SCHEDULE_POLICIES:
                return f"argument --schedule-policy: invalid choice: {argv[i + 1]!r}"
            i += 1
        i += 1
    if "--model-path" not in argv and "--model" not in argv:
        return "the following arguments are required: --model-path"
    return None


def main() -> None:
    argv = sys.argv[1:]
    record = os.environ.get("NIMBUS_SGLANG_STANDIN_RECORD")
    if record:
        env = {k: v for k, v in os.environ.items() if k.startswith(("CUDA_", "NIMBUS_"))}
        with open(record, "a") as f:
            f.write(json.dumps({"argv": argv, "env": env, "pid": os.getpid(),
                                "module": __spec__.name if __spec__ else __name__,
                                "python": sys.executable, "at": time.time()}) + "\n")
    problem = check(argv)
    if problem:
        print(f"usage: launch_server.py [-h] --model-path MODEL_PATH ...\nlaunch_server.py: error: {problem}",
              file=sys.stderr)
        raise SystemExit(2)
    extra = shlex.split(os.environ.get("NIMBUS_SGLANG_STANDIN_SIM_ARGS", ""))
    os.execv(sys.executable, [sys.executable, "-m", "dataplane.sim", *argv, *extra])


if __name__ == "__main__":
    main()
