"""The light transport's header reading agrees with ``http.client``'s, response by response.

``joblease.kube.lite`` reads a response's header block without the ``email`` parser (70 µs
a response, docs/benchmarks.md) and frames the body as ``HTTPResponse.begin`` does. What
each test breaks: a value or a repeated header read differently (a ``Date`` misread moves
the server-clock estimate; a lost ``Connection: close`` reuses a dead connection), a body
framed differently (a chunked watch read as one block, a 204 waited on forever).
Hypothesis writes the responses; the standard library is the oracle.
"""

from __future__ import annotations

import http.client
import io

from hypothesis import given
from hypothesis import strategies as st

from joblease.kube.lite import _LeanResponse, parse_header_block

NAME = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_."),
               min_size=1, max_size=20).filter(lambda n: not n.lower().startswith("from"))
VALUE = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"),
                max_size=40)
FOLD = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=20)


@st.composite
def header_blocks(draw: st.DrawFn) -> bytes:
    """A header block: fields, some repeated, some folded, CRLF or LF line ends."""
    end = draw(st.sampled_from(["\r\n", "\n"]))
    names = draw(st.lists(NAME, max_size=12))
    names += draw(st.lists(st.sampled_from(names), max_size=3)) if names else []
    lines = []
    for name in names:
        lines.append(f"{name}:{draw(st.sampled_from(['', ' ', '  ', chr(9)]))}{draw(VALUE)}{end}")
        for fold in draw(st.lists(FOLD, max_size=2)):
            lines.append(f"{draw(st.sampled_from([' ', chr(9)]))}{fold}{end}")
    return "".join(lines).encode("iso-8859-1")


@given(header_blocks())
def test_a_header_block_reads_as_the_standard_library_reads_it(block: bytes) -> None:
    ours = parse_header_block(io.BytesIO(block).readlines())
    theirs = http.client.parse_headers(io.BytesIO(block + b"\r\n"))
    assert ours.items() == theirs.items()
    for name in {name for name, _ in theirs.items()}:
        assert ours.get_all(name.upper()) == theirs.get_all(name.upper())


class _Socket:
    """What ``HTTPResponse`` reads from: a socket whose stream is the given bytes."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(io.BytesIO(self.data))  # type: ignore[arg-type]


STATUS = st.sampled_from([
    "HTTP/1.1 200 OK", "HTTP/1.1 201 Created", "HTTP/1.1 204 No Content",
    "HTTP/1.1 304 Not Modified", "HTTP/1.1 409 Conflict", "HTTP/1.0 200 OK",
    "HTTP/1.1 500  Internal Server Error ", "HTTP/1.1 100 Continue\r\nX-Interim: 1\r\n\r\n"
    "HTTP/1.1 200 OK"])
BODY = st.binary(max_size=64)


@st.composite
def responses(draw: st.DrawFn) -> bytes:
    """A response as kube-apiserver (or a proxy in between) might frame it."""
    body = draw(BODY)
    framing = draw(st.sampled_from(["length", "chunked", "none", "negative", "bad"]))
    headers = [("Content-Type", "application/json"),
               ("Date", "Mon, 07 Dec 2026 14:40:12 GMT"), ("Audit-Id", "a1")]
    headers += draw(st.lists(st.tuples(st.sampled_from(["Connection", "Keep-Alive",
                                                        "Proxy-Connection", "X-Other"]),
                                       st.sampled_from(["close", "keep-alive", "Close",
                                                        "Keep-Alive, x", ""])),
                             max_size=3))
    if framing == "chunked":
        headers.append(("Transfer-Encoding", draw(st.sampled_from(["chunked", "Chunked"]))))
        chunk = f"{len(body):x}\r\n".encode() + body + b"\r\n" if body else b""
        payload = chunk + b"0\r\n\r\n"
    else:
        length = {"length": str(len(body)), "negative": "-1", "bad": "1x"}.get(framing)
        if length is not None:
            headers.append(("Content-Length", length))
        payload = body
    head = "".join(f"{name}: {value}\r\n" for name, value in draw(st.permutations(headers)))
    return f"{draw(STATUS)}\r\n{head}\r\n".encode() + payload


@given(responses(), st.sampled_from(["GET", "PATCH", "HEAD"]))
def test_a_response_is_framed_as_the_standard_library_frames_it(raw: bytes, method: str
                                                                 ) -> None:
    ours = _LeanResponse(_Socket(raw), method=method)  # type: ignore[arg-type]
    theirs = http.client.HTTPResponse(_Socket(raw), method=method)  # type: ignore[arg-type]
    ours.begin()
    theirs.begin()
    seen = ("status", "reason", "version", "chunked", "chunk_left", "length", "will_close")
    assert {a: getattr(ours, a) for a in seen} == {a: getattr(theirs, a) for a in seen}
    assert ours.headers.items() == theirs.headers.items()
    assert ours.read() == theirs.read()
