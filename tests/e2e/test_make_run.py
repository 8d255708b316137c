"""CI smoke test of ``make run`` itself: start it, wait for the printed exports, get one completion
with them, check that the two demo pools (two 1-GPU replicas each) share one 4-GPU node as the
printed GPU map says, Ctrl-C it, and check that no process it started is left."""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import time
from pathlib import Path

import openai
import pytest

from controlplane.embedded import DEMO_POOL, DEMO_POOL_2, DEMO_REPLICAS
from tests.e2e.conftest import REPO_ROOT, descendants, processes_with_env, still_alive

pytestmark = pytest.mark.slow


def make_command() -> list[str]:
    # `make run` first brings the virtualenv up to date; the test suite already runs inside a set-up
    # one, so when the stamp is missing (a venv made without `make setup`) treat it as current.
    stamp = REPO_ROOT / ".venv" / ".installed"
    return ["make", "run"] if stamp.exists() else ["make", "-o", ".venv/.installed", "run"]


def test_make_run_prints_exports_that_work_and_ctrl_c_leaves_nothing(tmp_path: Path):
    state = tmp_path / "nimbus"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NIMBUS_")}
    env |= {"NIMBUS_STATE_DIR": str(state), "NIMBUS_EMBEDDED_API_PORT": "0", "NIMBUS_EMBEDDED_EDGE_PORT": "0",
            "TERM": "dumb"}
    started = time.monotonic()
    proc = subprocess.Popen(make_command(), cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    output = b""
    exports: dict[str, str] = {}
    try:
        deadline = time.monotonic() + 90
        while "NIMBUS_API_KEY" not in exports:
            assert proc.poll() is None, f"make run exited {proc.returncode}:\n{output.decode()}"
            assert time.monotonic() < deadline, f"no exports after 90 s:\n{output.decode()}"
            ready, _, _ = select.select([proc.stdout], [], [], 0.5)
            if ready:
                output += os.read(proc.stdout.fileno(), 65536)
                exports = dict(re.findall(r"^export (NIMBUS_\w+)=(\S+)$", output.decode(), re.MULTILINE))
        startup_s = time.monotonic() - started
        text = output.decode()
        assert "/console/login" in text
        # The curl line and the SDK snippet, run exactly as printed (from the repo root, like `make run`).
        curl = next(line for line in text.splitlines() if line.startswith("curl "))
        snippet = re.search(r"^\S+ - <<'EOF'\n.*?^EOF$", text, re.MULTILINE | re.DOTALL)[0]
        shell_env = {**os.environ, **exports}
        streamed = subprocess.run(["bash", "-c", curl], cwd=REPO_ROOT, env=shell_env, capture_output=True,
                                  text=True, timeout=60)
        assert '"delta"' in streamed.stdout and streamed.stdout.rstrip().endswith("data: [DONE]"), streamed
        printed = subprocess.run(["bash", "-c", snippet], cwd=REPO_ROOT, env=shell_env, capture_output=True,
                                 text=True, timeout=60)
        assert printed.returncode == 0 and printed.stdout.strip(), printed

        client = openai.OpenAI(base_url=exports["NIMBUS_EDGE_URL"] + "/v1", api_key=exports["NIMBUS_API_KEY"],
                               max_retries=0)
        reply = client.chat.completions.create(model="demo-llama", max_tokens=8,
                                               messages=[{"role": "user", "content": "Hello!"}])
        assert reply.choices[0].message.content and reply.usage.completion_tokens > 0
        assert startup_s < 60, f"make run took {startup_s:.0f} s to be ready"
        # Both demo pools' replicas share one node: the printed GPU map shows it (one line per node, its
        # four GPUs each held by a demo replica), and one agent runs the four engines.
        # (A step line ends with its time, "(12.3 s)"; the console may wrap a long one.)
        gpu_map = re.findall(r"node (\w+) \((sim-\w+)\): (GPU0: .*?)\(\d+\.\d s\)", text, re.DOTALL)
        assert len(gpu_map) == 1 and gpu_map[0][1] == "sim-4gpu", (gpu_map, text)
        cells = re.findall(r"GPU(\d+):\s+(\S+)", gpu_map[0][2])
        assert [int(g) for g, _ in cells] == [0, 1, 2, 3], gpu_map
        assert sorted(name for _, name in cells) == sorted([DEMO_POOL] * DEMO_REPLICAS + [DEMO_POOL_2] * DEMO_REPLICAS), \
            gpu_map
        running = processes_with_env(f"NIMBUS_STATE_DIR={state}")
        engines = [cmd for _, cmd in running if "dataplane.sim" in cmd]
        agents = [cmd for _, cmd in running if "dataplane.agent" in cmd]
        assert len(engines) == 2 * DEMO_REPLICAS, engines
        assert sum("--served-model-name demo-llama-bf16" in cmd for cmd in engines) == DEMO_REPLICAS, engines
        assert sum("--served-model-name demo-qwen-bf16" in cmd for cmd in engines) == DEMO_REPLICAS, engines
        assert len(agents) == 1, agents
    finally:
        tree = descendants(proc.pid)  # the runner, API, worker, beat, edge, Redis, agents, engines
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in the terminal reaches make and the runner
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        rest = proc.stdout.read().decode()
        left = sorted(set(still_alive(tree)) | {pid for pid, _ in processes_with_env(f"NIMBUS_STATE_DIR={state}")})
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    # Not vacuous: below make, the runner, API, worker, beat, edge, Redis (when installed), one agent and
    # its four engines.
    assert len(tree) >= 1 + 4 + bool(shutil.which("redis-server")) + 1 + 2 * DEMO_REPLICAS, tree
    assert left == [], f"left behind: {left}\n{rest}"
    assert "stopped" in rest and "node(s)" in rest
