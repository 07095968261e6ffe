"""A loopback TCP relay that can stop answering: the hung-request fault of issue 14 item 4.

``hang()`` keeps every connection open but stops relaying bytes in both directions, and
new connections are accepted and then left silent: to a client it looks exactly like an
API server that stopped responding (no reset, no error, nothing until its own timeout).
Built on the local cluster's ``LoopbackServer`` and ``relay`` (the HA load balancer's), with
the hang as the relay's cut.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path
from typing import Any

import yaml

from joblease_localcluster.lb import HOST, LoopbackServer, relay


class HangingProxy(LoopbackServer):
    """Relays 127.0.0.1:<port> to a backend port until told to hang."""

    def __init__(self, backend_port: int) -> None:
        super().__init__()
        self.backend_port = backend_port
        self._hung = threading.Event()
        self._sockets: list[socket.socket] = []

    def hang(self) -> None:
        """From now on, no byte passes in either direction; connections stay open."""
        self._hung.set()

    def _track(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            self._sockets.append(sock)
        return sock

    def _close_connections(self) -> int:
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()
        return len(sockets)

    def _serve(self, client: socket.socket) -> None:
        self._track(client)
        if not self._hung.is_set():
            backend = self._track(socket.create_connection((HOST, self.backend_port), 2))
            relay(client, backend, self._stop, cut=self._hung)
        if self._hung.is_set():
            self._stop.wait()  # accepted (or cut), never answered: silent until stopped


def api_port(cluster: Any) -> int:
    """The port of ``cluster``'s API server, as its admin kubeconfig names it."""
    config = yaml.safe_load(Path(cluster.kubeconfig_for("admin")).read_text())
    return int(config["clusters"][0]["cluster"]["server"].rsplit(":", 1)[1])


def kubeconfig_via(cluster: Any, port: int, tmp_path: Path) -> Path:
    """The admin kubeconfig of ``cluster``, pointed at ``port`` on the same host (a proxy)."""
    config = yaml.safe_load(Path(cluster.kubeconfig_for("admin")).read_text())
    for entry in config["clusters"]:
        server = entry["cluster"]["server"]
        entry["cluster"]["server"] = server.rsplit(":", 1)[0] + f":{port}"
    path = tmp_path / "kubeconfig-proxy"
    path.write_text(yaml.safe_dump(config))
    return path
