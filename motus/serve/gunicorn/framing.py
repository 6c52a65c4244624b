"""Request framing for ``MotusWorker``'s main loop: where a request ends, read without a thread.

Owns the rules a request must meet before a thread sees it: the head's limits (request line,
header fields, their count, ``MAX_HEAD_BYTES``), the body's framing (one Content-Length, or
``Transfer-Encoding: chunked`` and nothing else; never both), ``Expect: 100-continue``, and
the body limit. ``RequestReader`` judges bytes as they arrive and says whether the request is
complete, needs more, or is refused (``Refused``, with the 4xx status and a detail that names
the problem); ``status_answer`` writes such a refusal as a complete answer.

Guarantees: every request it declares complete is whole and framed the way gunicorn's parser
reads it (the thread parses the same bytes again); it never reads a socket, holds no lock and
is used by the main loop only. No gunicorn internals are touched here.
"""

from __future__ import annotations

import json
import re
from typing import Any

#: Bytes of one request head (request line and header fields) the main loop holds: past it,
#: 431. gunicorn's own limits apply per line (``limit_request_line``, 4094 bytes, 414;
#: ``limit_request_field_size``, 8190 bytes, 431) and per count (``limit_request_fields``, 100).
MAX_HEAD_BYTES = 64 * 1024
#: The largest body when the application sets no ``MAX_CONTENT_LENGTH`` (motus sets it from
#: ``--max-request-bytes``).
DEFAULT_MAX_BODY = 10 * 1024 * 1024
#: A chunked body may come in at most this many chunks (each costs the main loop a little
#: work, so a body of one-byte chunks is refused rather than scanned).
MAX_CHUNKS = 65536

_HEX = re.compile(rb"[0-9A-Fa-f]+")
_REASONS = {
    400: "Bad Request",
    408: "Request Timeout",
    413: "Content Too Large",
    414: "URI Too Long",
    417: "Expectation Failed",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


def timeout_detail(seconds: float) -> str:
    return f"the request's headers and body must arrive within {seconds:g} s (--read-timeout)"


def status_answer(status: int, detail: str, headers: tuple[tuple[str, str], ...] = ()) -> bytes:
    """A complete answer that closes the connection, its body ``{"detail": ...}`` as the
    application's errors are."""
    reason = _REASONS.get(status, "Error")
    body = json.dumps({"detail": detail}).encode()
    extra = "".join(f"{name}: {value}\r\n" for name, value in headers).encode("latin-1")
    return (
        b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
        b"Cache-Control: no-store\r\nConnection: close\r\n%s\r\n%s"
        % (status, reason.encode(), len(body), extra, body)
    )


class Refused(Exception):
    """A request the main loop answers itself (``status`` and ``detail``) and then closes:
    a head or body past a limit, or framing that cannot be read safely."""

    def __init__(self, status: int, detail: str, headers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = headers


class Limits:
    """What the main loop enforces while it reads a request (from gunicorn's settings and
    the application's body limit)."""

    __slots__ = ("request_line", "field_size", "fields", "max_body")

    def __init__(self, cfg: Any, max_body: int) -> None:
        line = cfg.limit_request_line
        self.request_line = MAX_HEAD_BYTES if line <= 0 else min(line, 8190)
        self.field_size = cfg.limit_request_field_size if cfg.limit_request_field_size > 0 else 8190
        self.fields = cfg.limit_request_fields if cfg.limit_request_fields > 0 else 32768
        self.max_body = max_body


class _ChunkScanner:
    """Finds where a chunked body ends (RFC 9112 7.1) as its bytes arrive, without decoding
    it: gunicorn decodes it again in the thread, from the same bytes. Only the framing is
    judged here (sizes, the CRLF after each chunk's data, the trailer section's end); what
    gunicorn refuses beyond that (a malformed extension or trailer field) reaches the
    application as a 400 without any wait, since every byte is there."""

    SIZE, DATA, DATA_END, TRAILER = range(4)
    __slots__ = ("start", "pos", "phase", "left", "size", "chunks", "trailer", "limits")

    def __init__(self, start: int, limits: Limits) -> None:
        self.start = self.pos = start
        self.phase = self.SIZE
        self.left = 0  # bytes of the current chunk's data still to come
        self.size = 0  # decoded bytes so far
        self.chunks = 0
        self.trailer = 0
        self.limits = limits

    def scan(self, buf: bytearray) -> int | None:
        """Where the body ends in ``buf`` (just past it), or None while it has not."""
        pos, end, limits = self.pos, len(buf), self.limits
        try:
            while True:
                if self.phase == self.DATA:
                    taken = min(self.left, end - pos)
                    pos += taken
                    self.left -= taken
                    if self.left:
                        return None
                    self.phase = self.DATA_END
                if self.phase == self.DATA_END:
                    if end - pos < 2:
                        return None
                    if buf[pos:pos + 2] != b"\r\n":
                        raise Refused(400, "Malformed chunked body: a chunk's data is longer than its size says (no CRLF after it)")
                    pos += 2
                    self.phase = self.SIZE
                line_end = buf.find(b"\r\n", pos)
                if line_end < 0:
                    if end - pos > limits.field_size:
                        what = "trailer field" if self.phase == self.TRAILER else "chunk size line"
                        raise Refused(431 if self.phase == self.TRAILER else 400, f"Malformed chunked body: a {what} longer than {limits.field_size} bytes")
                    return None
                if self.phase == self.TRAILER:
                    if line_end == pos:  # the empty line that ends the trailer section
                        pos += 2
                        return pos
                    self.trailer += line_end + 2 - pos
                    if self.trailer > MAX_HEAD_BYTES:
                        raise Refused(431, f"Malformed chunked body: trailer fields over {MAX_HEAD_BYTES} bytes")
                    pos = line_end + 2
                    continue
                line = bytes(buf[pos:line_end])
                size_text, semicolon, _ = line.partition(b";")
                if semicolon:
                    size_text = size_text.rstrip(b" \t")
                if not _HEX.fullmatch(size_text):
                    raise Refused(400, f"Malformed chunked body: chunk size {size_text[:20].decode('latin-1')!r} is not a hexadecimal number")
                size = int(size_text, 16)
                self.chunks += 1
                self.size += size
                if self.size > limits.max_body:
                    raise Refused(413, f"Request body too large: the limit is {limits.max_body} bytes (--max-request-bytes)")
                if self.chunks > MAX_CHUNKS:
                    raise Refused(400, f"Chunked body in more than {MAX_CHUNKS} chunks: send larger chunks, or a Content-Length")
                pos = line_end + 2
                if size:
                    self.phase, self.left = self.DATA, size
                else:
                    self.phase = self.TRAILER
        finally:
            self.pos = pos


class RequestReader:
    """One request being read by the main loop, without a thread.

    The worker appends what it receives to ``buf``; ``state()`` says whether the request is
    complete (``READY``: it ends at ``end``, and any bytes after it belong to the next
    request) or needs more (``WAITING``), and raises ``Refused`` for a request that will not
    be read: a head past its limits, framing that is malformed or ambiguous (a
    Content-Length and a Transfer-Encoding, several Content-Lengths, a coding other than
    chunked, a chunked HTTP/1.0 request), an expectation other than ``100-continue``, a body
    over the limit. Every request a thread sees is thus whole, and its framing is the one
    gunicorn reads: it parses the same bytes again, and never reads the socket.
    """

    WAITING, READY = "waiting", "ready"

    __slots__ = (
        "buf", "deadline", "limits", "registered", "_scanned", "_line_start", "_lines",
        "_body_start", "_end", "_chunks", "_continue",
    )

    def __init__(self, deadline: float, limits: Limits, data: bytes = b"") -> None:
        self.buf = bytearray(data)
        self.deadline = deadline
        self.limits = limits
        self.registered = False
        self._scanned = 0  # head bytes checked so far
        self._line_start = 0  # where the head's current line began
        self._lines = 0  # complete lines of the head (the request line first)
        self._body_start: int | None = None
        self._end: int | None = None  # where the request ends, once known
        self._chunks: _ChunkScanner | None = None
        self._continue = False  # owes the client a 100 Continue before its body

    @property
    def begun(self) -> bool:
        return bool(self.buf)

    @property
    def end(self) -> int:
        assert self._end is not None
        return self._end

    def state(self) -> str:
        if self._body_start is None and not self._scan_head():
            return self.WAITING
        if self._end is None:
            self._end = self._chunks.scan(self.buf)  # type: ignore[union-attr]
            if self._end is None:
                return self.WAITING
        return self.READY if len(self.buf) >= self._end else self.WAITING

    @property
    def body_pending(self) -> bool:
        """The head is in and the body is not: the bytes still to come are a body's."""
        return self._body_start is not None

    def take_continue(self) -> bool:
        """True once, if the client waits for ``100 Continue`` before sending its body."""
        owed, self._continue = self._continue, False
        return owed

    def _scan_head(self) -> bool:
        buf = self.buf
        if self._lines == 0 and self._line_start == 0:
            while buf[:2] == b"\r\n":  # RFC 9112 2.2: empty lines before the request line
                del buf[:2]
        while True:
            newline = buf.find(b"\n", self._scanned)
            if newline < 0:
                self._scanned = len(buf)
                self._check_line(len(buf) - self._line_start - 1)  # its CR may have come
                if len(buf) > MAX_HEAD_BYTES:
                    raise Refused(431, f"Request head too large: the request line and header fields may total at most {MAX_HEAD_BYTES} bytes")
                return False
            if newline == self._line_start or buf[newline - 1] != 0x0D:
                raise Refused(400, "Malformed request head: a line ends with a bare LF; HTTP lines end with CRLF")
            length = newline - 1 - self._line_start
            self._line_start = self._scanned = newline + 1
            if length == 0 and self._lines:
                self._body_start = newline + 1
                if self._body_start > MAX_HEAD_BYTES:
                    raise Refused(431, f"Request head too large: the request line and header fields may total at most {MAX_HEAD_BYTES} bytes")
                self._read_head()
                return True
            self._check_line(length)
            self._lines += 1
            if self._lines - 1 > self.limits.fields:
                raise Refused(431, f"Request head too large: more than {self.limits.fields} header fields")

    def _check_line(self, length: int) -> None:
        if self._lines == 0:
            if length > self.limits.request_line:
                raise Refused(414, f"Request line too long: the limit is {self.limits.request_line} bytes")
        elif length + 2 > self.limits.field_size:
            raise Refused(431, f"Request head too large: a header field is longer than {self.limits.field_size} bytes")

    def _read_head(self) -> None:
        """Learn from the complete head where the body ends, or refuse the request."""
        body_start = self._body_start
        assert body_start is not None
        request_line, *fields = bytes(self.buf[:body_start - 4]).split(b"\r\n")
        http10 = request_line.rsplit(b" ", 1)[-1] == b"HTTP/1.0"
        lengths: list[bytes] = []
        codings: list[bytes] = []
        expect_lines: list[tuple[int, int]] = []
        offset = len(request_line) + 2
        for line in fields:
            name, colon, value = line.partition(b":")
            if not colon or not name or name != name.strip(b" \t"):
                shown = line[:60].decode("latin-1")
                raise Refused(400, f"Malformed header line {shown!r} (a field is 'Name: value' on one line; obsolete line folding is not accepted)")
            key, value = name.lower(), value.strip(b" \t")
            if key == b"content-length":
                lengths.append(value)
            elif key == b"transfer-encoding":
                codings.extend(item.strip(b" \t").lower() for item in value.split(b","))
            elif key == b"expect":
                if value.lower() != b"100-continue":
                    shown = value[:60].decode("latin-1")
                    raise Refused(417, f"Expectation failed: 'Expect: {shown}' is not supported; the only expectation understood is 100-continue")
                expect_lines.append((offset, offset + len(line) + 2))
            offset += len(line) + 2
        if codings:
            if lengths:
                raise Refused(400, "Ambiguous request: it has both a Content-Length and a Transfer-Encoding; send one of them")
            if http10:
                raise Refused(400, "Malformed request: Transfer-Encoding is not allowed in an HTTP/1.0 request; send a Content-Length")
            if codings[-1] != b"chunked" or any(coding != b"identity" for coding in codings[:-1]):
                shown = ", ".join(coding.decode("latin-1") for coding in codings)[:80]
                raise Refused(400, f"Unsupported Transfer-Encoding {shown!r}: send the body chunked ('Transfer-Encoding: chunked') or with a Content-Length")
        elif len(lengths) > 1:
            raise Refused(400, f"Ambiguous request: Content-Length is given {len(lengths)} times; give it once")
        elif lengths and not lengths[0].isdigit():
            shown = lengths[0][:30].decode("latin-1")
            raise Refused(400, f"Malformed request: Content-Length {shown!r} is not a number of bytes")
        if expect_lines and not http10:
            # HTTP/1.1 "Expect: 100-continue": the 100 comes from here (if the body has not
            # come with the head); the lines go, so gunicorn does not send another. An HTTP/1.0
            # client's expectation is ignored (RFC 9110 10.1.1), by gunicorn too.
            for begin, finish in reversed(expect_lines):
                del self.buf[begin:finish]
                body_start -= finish - begin
            self._body_start = body_start
            self._continue = True
        if codings:
            self._chunks = _ChunkScanner(body_start, self.limits)
            return
        length = int(lengths[0]) if lengths else 0
        if length > self.limits.max_body:
            raise Refused(413, f"Request body too large: the limit is {self.limits.max_body} bytes (--max-request-bytes)")
        self._end = body_start + length
        if not length:
            self._continue = False


