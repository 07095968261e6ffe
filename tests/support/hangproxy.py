"""A loopback TCP relay that can stop answering: the hung-request fault of issue 14 item 4.

``hang()`` keeps every connection open but stops relaying bytes in both directions, and
new connections are accepted and then left silent: to a client it looks exactly like an
API server that stopped responding (no reset, no error, nothing until its own timeout).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Self

HOST = "127.0.0.1"


class HangingProxy:
    """Relays 127.0.0.1:<port> to a backend port until told to hang."""

    def __init__(self, backend_port: int) -> None:
        self.backend_port = backend_port
        self._listener = socket.create_server((HOST, 0))
        self._listener.settimeout(0.2)
        self.port = int(self._listener.getsockname()[1])
        self._hung = threading.Event()
        self._stop = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def start(self) -> Self:
        self._thread.start()
        return self

    def hang(self) -> None:
        """From now on, no byte passes in either direction; connections stay open."""
        self._hung.set()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()
        self._listener.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _track(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            self._sockets.append(sock)
        return sock

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._track(client)
            if self._hung.is_set():
                continue  # accepted, never answered
            backend = self._track(socket.create_connection((HOST, self.backend_port), 2))
            for a, b in ((client, backend), (backend, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        src.settimeout(0.2)
        while not self._stop.is_set():
            try:
                data = src.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            while self._hung.is_set() and not self._stop.is_set():
                self._stop.wait(0.2)  # swallow: the peer waits for ever
            if self._stop.is_set():
                return
            with contextlib.suppress(OSError):
                dst.sendall(data)
