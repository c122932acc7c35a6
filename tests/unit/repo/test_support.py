"""tests/support.free_ports: no port handed out twice to live processes on one machine."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import support

pytestmark = pytest.mark.unit


@pytest.fixture
def reservations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(support, "PORT_RESERVATIONS", tmp_path / "ports")
    return tmp_path / "ports"


def _candidates(monkeypatch: pytest.MonkeyPatch, ports: list[int]) -> None:
    """The ports free_ports tries, in this order (its random draw, fixed for the test)."""
    draws: Iterator[int] = iter(ports)
    monkeypatch.setattr(support.random, "randrange", lambda *_: next(draws))


def _dead_pid() -> int:
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(child.stdout)


def _unused_ports(count: int) -> list[int]:
    """`count` bindable ports of the range, from its top (the tests reserve them in their own folder)."""
    low, high = support.PORT_RANGE
    ports = [port for port in range(high - 1, low, -1) if support._bindable(port)][:count]
    assert len(ports) == count, "no bindable ports in the range"
    return ports


def test_ports_are_distinct_bindable_below_the_ephemeral_range_and_reserved(reservations: Path) -> None:
    ports = support.free_ports(6)
    assert len(set(ports)) == 6
    low, high = support.PORT_RANGE
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert all(low <= port < high <= ephemeral_low for port in ports), ports
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
        assert (reservations / str(port)).read_text() == str(os.getpid())


def test_a_port_a_live_process_holds_is_skipped_and_a_dead_ones_taken_back(
    reservations: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    held_by_live, held_by_dead = _unused_ports(2)
    reservations.mkdir()
    (reservations / str(held_by_live)).write_text(str(os.getppid()))
    (reservations / str(held_by_dead)).write_text(str(_dead_pid()))
    _candidates(monkeypatch, [held_by_live, held_by_dead])
    assert support.free_ports(1) == [held_by_dead]
    assert (reservations / str(held_by_live)).read_text() == str(os.getppid())
    assert (reservations / str(held_by_dead)).read_text() == str(os.getpid())


def test_a_port_is_not_handed_out_twice_to_one_process(
    reservations: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port, other = _unused_ports(2)
    _candidates(monkeypatch, [port, port, other])
    assert support.free_ports(1) == [port]
    assert support.free_ports(1) == [other]


def test_a_port_in_use_is_skipped(reservations: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    taken, other = _unused_ports(2)
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", taken))
        listening.listen()
        _candidates(monkeypatch, [taken, other])
        assert support.free_ports(1) == [other]
