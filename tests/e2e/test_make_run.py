"""CI smoke test of ``make run`` itself: start it, wait for the printed exports, get one completion
with them, Ctrl-C it, and check that no process it started is left."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import time
from pathlib import Path

import openai
import pytest

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
        engines = [cmd for _, cmd in processes_with_env(f"NIMBUS_STATE_DIR={state}") if "dataplane.sim" in cmd]
        assert len(engines) == 2, engines
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
    assert len(tree) >= 10, tree  # not vacuous: make, runner, API, worker, beat, edge, Redis, 2 agents, 2 engines
    assert left == [], f"left behind: {left}\n{rest}"
    assert "stopped" in rest and "node(s)" in rest
