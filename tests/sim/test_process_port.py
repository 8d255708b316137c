"""A port picked for a simulator can be taken before the simulator binds it (other tests start
processes concurrently): the simulator exits, and the launcher starts it again on another port."""

from __future__ import annotations

import socket

import pytest

import dataplane.sim.process as sim_process
from dataplane.sim.process import SimProcess


def test_a_simulator_whose_picked_port_is_taken_starts_on_another(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()  # takes connections, never answers: /health there cannot pass
        taken = squatter.getsockname()[1]
        picks = iter([taken])
        real = sim_process.free_port
        monkeypatch.setattr(sim_process, "free_port", lambda host="127.0.0.1": next(picks, None) or real(host))
        sim = SimProcess(ready_delay=0.0)
        assert sim.port == taken
        try:
            sim.start(30)
            assert sim.port != taken and str(sim.port) in sim.args
            assert sim.proc is not None and sim.proc.poll() is None
        finally:
            sim.stop()


def test_a_simulator_on_a_port_it_was_given_does_not_move() -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        sim = SimProcess(ready_delay=0.0, port=taken)
        try:
            with pytest.raises(RuntimeError, match="simulator exited"):
                sim.start(30)
            assert sim.port == taken
        finally:
            sim.stop()
