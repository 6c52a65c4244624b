"""``motus.serve.gunicorn.private``: the one module that touches gunicorn's internals.

The layering is checked from the source (no other module of the package imports gunicorn
beyond its documented ``BaseApplication``), and the helpers that bridge gunicorn versions are
checked on both sides of the version they bridge.
"""

from __future__ import annotations

import ast
import io
from pathlib import Path
from types import SimpleNamespace

from gunicorn.config import Config

from motus.serve.gunicorn import private

PACKAGE = Path(private.__file__).parent
#: What each module of the package may import from gunicorn; private.py may import anything.
ALLOWED = {"app.py": {"gunicorn.app.base"}}


def _gunicorn_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "gunicorn":
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "gunicorn")
    return found


def test_only_private_reaches_into_gunicorn() -> None:
    modules = sorted(PACKAGE.glob("*.py"))
    assert {path.name for path in modules} >= {"app.py", "arbiter.py", "worker.py", "framing.py", "private.py"}
    for path in modules:
        if path.name == "private.py":
            continue
        assert _gunicorn_imports(path) <= ALLOWED.get(path.name, set()), path.name


def test_the_control_socket_is_disabled_only_where_gunicorn_has_one() -> None:
    assert private.control_socket_options({"bind": object()}) == {}
    settings = Config().settings
    expected = {"control_socket_disable": True} if "control_socket_disable" in settings else {}
    assert private.control_socket_options(settings) == expected


class _OldUnreader:
    """An ``Unreader`` as gunicorn had it before 26.2: a ``buf`` and no ``take_buffered``."""

    def __init__(self, data: bytes) -> None:
        self.buf = io.BytesIO(data)
        self.buf.seek(0, io.SEEK_END)


def test_take_buffered_takes_the_read_ahead_with_or_without_gunicorn_s_method() -> None:
    assert private.take_buffered(SimpleNamespace(parser=None)) == b""
    old = _OldUnreader(b"GET / HTTP/1.1\r\n")
    conn = SimpleNamespace(parser=SimpleNamespace(unreader=old))
    assert private.take_buffered(conn) == b"GET / HTTP/1.1\r\n"
    assert private.take_buffered(conn) == b""  # taken: the parser no longer holds it
    held = private.HeldRequest(bytearray(b"abc"))
    held.unread(b"next")
    conn = SimpleNamespace(parser=SimpleNamespace(unreader=held))
    assert private.take_buffered(conn) == b"next"
    assert private.take_buffered(conn) == b""


def test_a_held_request_reads_from_memory_then_ends() -> None:
    data = bytearray(b"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi")
    held = private.HeldRequest(data)
    assert held.read() == bytes(data)
    assert held.chunk() == b""
    held.release()
    assert held.chunk() == b""  # released: nothing more, never the socket
