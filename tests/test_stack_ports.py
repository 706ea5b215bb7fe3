"""``free_port``: listening ports for the processes the tests and benchmarks start are picked
below the kernel's ephemeral range, so no outgoing connection or bind to port 0 elsewhere can
take one between the pick and the engine's own bind."""

from __future__ import annotations

import socket
from pathlib import Path

from prefixserving_lab.runners.stack import processes


def test_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    low = processes._ephemeral_low()
    ports = [processes.free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(
        processes._LISTEN_PORTS.start <= p < min(low, processes._LISTEN_PORTS.stop) for p in ports
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))


def test_a_port_in_use_is_skipped() -> None:
    first = processes.free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first + 1))
        assert processes.free_port() != first + 1


def test_the_range_falls_back_to_linux_default(tmp_path: Path) -> None:
    assert processes._ephemeral_low(tmp_path / "missing") == 32768
    (tmp_path / "range").write_text("20000\t60999\n")
    assert processes._ephemeral_low(tmp_path / "range") == 20000
