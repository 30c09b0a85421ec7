"""Local TCP ports: is one taken, and which one is free (for rendezvous on this machine)."""

from __future__ import annotations

import socket

__all__ = ["get_free_port", "is_port_in_use"]

_DEFAULT_PORT = 29500  # torch.distributed's default MASTER_PORT


def is_port_in_use(port: int | None = None) -> bool:
    """Return whether something accepts connections on `port` of localhost (default 29500).

    Used before a launch to tell whether another run already holds the rendezvous port.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(2.0)
        return sock.connect_ex(("localhost", _DEFAULT_PORT if port is None else port)) == 0


def get_free_port() -> int:
    """Return a TCP port the OS reports free right now (bind to port 0 and read it back)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])
