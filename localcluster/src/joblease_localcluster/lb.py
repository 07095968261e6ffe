"""A loopback TCP load balancer: round-robin per connection, for an HA local control plane.

Why our own: production clusters put several kube-apiservers behind a TCP load balancer,
and the interesting behaviour (a client's keep-alive connection pinned to one server, a
reset when that server dies, a reconnect that lands elsewhere) is at the TCP level. A
small threaded relay gives exactly that without installing HAProxy, and lets tests drop
a client's connections on purpose (:meth:`LoadBalancer.partition`).

Guarantees:
    * Listens on 127.0.0.1 only. Each accepted connection is relayed, byte for byte, to
      the next backend in turn; a backend that refuses the connection is skipped (at most
      one pass over the list), so a killed server costs its clients one failed request.
    * ``partition()`` closes every relayed connection at once and closes new ones on
      accept until ``heal()``: to a client it looks like a network partition.
    * ``stop()`` closes the listener and every connection and joins its threads (bounded).

Run standalone (how ``LocalCluster`` with several API servers runs it, so the relay
outlives a detached ``joblease-localcluster up``)::

    python -m joblease_localcluster.lb --port P --backend 127.0.0.1:A --backend 127.0.0.1:B
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import selectors
import signal
import socket
import sys
import threading
from collections import Counter
from collections.abc import Sequence
from types import FrameType
from typing import Self

HOST = "127.0.0.1"
CONNECT_TIMEOUT = 2.0
POLL = 0.2  # how often relay threads look at the stop/partition flags
BUFFER = 64 * 1024


class LoopbackServer:
    """A threaded TCP server on 127.0.0.1: the listener, its threads and a bounded stop.

    Shared by :class:`LoadBalancer` and ``dateskew.DateSkewProxy``; subclasses implement
    :meth:`_serve` (one thread per accepted connection) and may veto a connection in
    :meth:`_admit`.
    """

    def __init__(self, port: int = 0, backlog: int = 128) -> None:
        self._requested_port = port
        self._backlog = backlog
        self._listener: socket.socket | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    @property
    def port(self) -> int:
        """The listening port."""
        if self._listener is None:
            raise RuntimeError(f"the {type(self).__name__} is not started")
        port: int = self._listener.getsockname()[1]
        return port

    def start(self) -> Self:
        """Bind 127.0.0.1 and start accepting (returns self)."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((HOST, self._requested_port))
        listener.listen(self._backlog)
        listener.settimeout(POLL)
        self._listener = listener
        self._spawn(self._accept_loop)
        return self

    def stop(self) -> None:
        """Close the listener and open connections; join the threads (each within ``POLL``)."""
        self._stop.set()
        if self._listener is not None:
            _close(self._listener)
        self._close_connections()
        for thread in list(self._threads):
            thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _close_connections(self) -> int:
        """Close what :meth:`stop` must close besides the listener; return how many."""
        return 0

    def _admit(self, client: socket.socket) -> bool:
        """Whether to serve an accepted connection (default: always)."""
        return True

    def _serve(self, client: socket.socket) -> None:
        raise NotImplementedError

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # listener closed
            if self._admit(client):
                self._spawn(self._serve, client)


class LoadBalancer(LoopbackServer):
    """Relays each TCP connection to the next backend (round-robin per connection).

    Args:
        backends: The backends' ports on 127.0.0.1.
        port: The port to listen on (0: pick a free one; see :attr:`port`).
    """

    def __init__(self, backends: Sequence[int], port: int = 0) -> None:
        if not backends:
            raise ValueError("a load balancer needs at least one backend")
        super().__init__(port, backlog=256)
        self.backends = list(backends)
        self._next = itertools.count()
        self._partitioned = threading.Event()
        self._conns: set[socket.socket] = set()
        self.routed: Counter[int] = Counter()  # connections per backend port
        self.dropped = 0  # connections closed by partition()

    def partition(self) -> None:
        """Drop every relayed connection now and refuse new ones until :meth:`heal`."""
        self._partitioned.set()
        self.dropped += self._close_connections() // 2  # two sockets per relayed connection

    def heal(self) -> None:
        """Relay new connections again."""
        self._partitioned.clear()

    def _close_connections(self) -> int:
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            _close(conn)
        return len(conns)

    def _admit(self, client: socket.socket) -> bool:
        if self._partitioned.is_set():
            _close(client)
            self.dropped += 1
            return False
        return True

    def _connect_backend(self) -> socket.socket | None:
        for _ in range(len(self.backends)):
            port = self.backends[next(self._next) % len(self.backends)]
            try:
                upstream = socket.create_connection((HOST, port), timeout=CONNECT_TIMEOUT)
            except OSError:
                continue  # dead or not yet listening: try the next one
            self.routed[port] += 1
            return upstream
        return None

    def _serve(self, client: socket.socket) -> None:
        upstream = self._connect_backend()
        if upstream is None:
            _close(client)
            return
        with self._lock:
            self._conns.update((client, upstream))
        try:
            relay(client, upstream, self._stop, self._partitioned)
        finally:
            with self._lock:
                self._conns.difference_update((client, upstream))
            _close(client)
            _close(upstream)


def relay(a: socket.socket, b: socket.socket, stop: threading.Event,
          cut: threading.Event | None = None) -> None:
    """Copy bytes both ways until either side closes, ``stop`` or ``cut`` is set."""
    for sock in (a, b):
        sock.setblocking(True)
        sock.settimeout(None)
    peer = {a: b, b: a}
    with selectors.DefaultSelector() as sel:
        sel.register(a, selectors.EVENT_READ)
        sel.register(b, selectors.EVENT_READ)
        while not stop.is_set() and not (cut is not None and cut.is_set()):
            try:
                ready = sel.select(timeout=POLL)
                for key, _ in ready:
                    src: socket.socket = key.fileobj  # type: ignore[assignment]
                    data = src.recv(BUFFER)
                    if not data:
                        return
                    peer[src].sendall(data)
            except (OSError, ValueError):
                return


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


def main(argv: list[str] | None = None) -> int:
    """Run a load balancer until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(prog="joblease-lb")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--backend", action="append", required=True,
                        help="127.0.0.1:PORT (repeat)")
    args = parser.parse_args(argv)
    ports = []
    for backend in args.backend:
        host, _, port = backend.rpartition(":")
        if host not in (HOST, ""):
            parser.error(f"backends must be on {HOST}: {backend}")
        ports.append(int(port))
    lb = LoadBalancer(ports, port=args.port).start()
    done = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"listening on {HOST}:{lb.port}, backends {ports}", flush=True)
    while not done.wait(1.0):
        pass
    lb.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
