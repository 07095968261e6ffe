"""A loopback TLS proxy that shifts the ``Date`` header of one API server's responses.

Why: the API servers here are static Go binaries that libfaketime cannot skew (see
``docs/ha.md``), yet the ``Date`` header is exactly the input joblease's server-clock
estimate trusts. Putting this proxy in front of one kube-apiserver makes that server look,
to every client, as if its clock were ``offset`` seconds off, which is what an HA control
plane with an unsynchronised member looks like from outside.

How: TLS is terminated with a certificate signed by the cluster CA (SAN 127.0.0.1, so a
client dialling the load balancer verifies it like the real servers), and re-originated
to the real server (verified against the same CA). Each request is forwarded with
``Connection: close``, so a connection carries exactly one response: the proxy rewrites
that response's ``Date`` line and then relays the rest verbatim (bodies, chunked or
streamed watches) without parsing HTTP framing. The price is one TLS handshake per request,
irrelevant for tests. Only HTTP/1.1 is offered (ALPN), which is what the Python client
speaks.

Guarantees: listens on 127.0.0.1 only; every connection thread is bounded by the proxy's
stop flag; ``stop()`` joins them.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
from datetime import timedelta
from email.utils import format_datetime, parsedate_to_datetime
from pathlib import Path

from joblease_localcluster.lb import LoopbackServer, relay

HOST = "127.0.0.1"
MAX_HEAD = 64 * 1024


class DateSkewProxy(LoopbackServer):
    """Forward to ``127.0.0.1:upstream_port`` over TLS, shifting ``Date`` by ``offset``.

    Args:
        upstream_port: The real kube-apiserver's port.
        ca_file: The cluster CA (verifies the upstream).
        cert_file: This proxy's serving certificate, signed by the cluster CA.
        key_file: Its key.
        offset: Seconds added to every ``Date`` header (negative: a slow clock).
    """

    def __init__(self, upstream_port: int, ca_file: Path, cert_file: Path, key_file: Path,
                 offset: float = 0.0) -> None:
        super().__init__()
        self.upstream_port = upstream_port
        self.offset = offset
        self.rewritten = 0
        self._server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._server_ctx.load_cert_chain(str(cert_file), str(key_file))
        self._server_ctx.set_alpn_protocols(["http/1.1"])
        self._client_ctx = ssl.create_default_context(cafile=str(ca_file))
        self._client_ctx.set_alpn_protocols(["http/1.1"])

    def _serve(self, raw: socket.socket) -> None:
        client: socket.socket | None = None
        upstream: socket.socket | None = None
        try:
            raw.settimeout(10)
            client = self._server_ctx.wrap_socket(raw, server_side=True)
            head, rest = _read_head(client)
            if head is None:
                return
            upstream = self._client_ctx.wrap_socket(
                socket.create_connection((HOST, self.upstream_port), timeout=10),
                server_hostname=HOST)
            upstream.sendall(force_close(head) + rest)
            reply, body = _read_head(upstream)
            if reply is None:
                return
            client.sendall(self.shift_date(reply) + body)
            relay(client, upstream, self._stop)
        except (OSError, ssl.SSLError, ValueError):
            return
        finally:
            for sock in (client, upstream, raw):
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.close()

    def shift_date(self, head: bytes) -> bytes:
        """Return the response head with its ``Date`` moved by ``offset`` seconds."""
        lines = head.split(b"\r\n")
        for i, line in enumerate(lines):
            name, sep, value = line.partition(b":")
            if sep and name.strip().lower() == b"date":
                when = parsedate_to_datetime(value.strip().decode("latin-1"))
                shifted = when + timedelta(seconds=self.offset)
                lines[i] = b"Date: " + format_datetime(shifted, usegmt=True).encode()
                self.rewritten += 1
        return b"\r\n".join(lines)


def force_close(head: bytes) -> bytes:
    """Return a request head asking for ``Connection: close`` (one response per connection)."""
    lines = [line for line in head.split(b"\r\n")
             if line.partition(b":")[0].strip().lower() not in (b"connection", b"keep-alive")]
    # head ends with b"\r\n\r\n": the split leaves two empty strings at the end
    while lines and lines[-1] == b"":
        lines.pop()
    return b"\r\n".join([*lines, b"Connection: close", b"", b""])


def _read_head(sock: socket.socket) -> tuple[bytes | None, bytes]:
    """Read up to the end of an HTTP head; return (head incl. blank line, bytes after it)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(16 * 1024)
        if not chunk:
            return None, b""
        data += chunk
        if len(data) > MAX_HEAD:
            raise ValueError("HTTP head too large")
    end = data.index(b"\r\n\r\n") + 4
    return data[:end], data[end:]


__all__ = ["DateSkewProxy", "force_close"]
