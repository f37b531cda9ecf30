"""Read a small file the operator named (a scenario, a cluster dump, a web-config) at bounded cost,
and check the kind of files a library reads itself (TLS certificates and keys, a kubeconfig).

``open(path).read()`` trusts the file to be one: ``/dev/zero`` never ends (a ``MemoryError``
after eating the machine's memory), a FIFO with no writer blocks ``open`` for ever, and a
``stat`` size check says nothing about either (both have size 0). So the file is opened with
``O_NONBLOCK`` (``open`` of a FIFO returns at once), ``fstat``-ed on that descriptor (no race
with a rename), refused unless it is a regular file, and read up to ``limit + 1`` bytes
whatever its size claims (files under /proc say 0; a file may grow while being read).

Errors are ``OSError`` subclasses, so callers keep their ``FileNotFoundError`` /
``IsADirectoryError`` / ``OSError`` branches and word the message for their own file.
Written by hand: the standard library has no size-bounded, type-checked file read.
"""

from __future__ import annotations

import errno
import os
import stat

_CHUNK = 1 << 16

# What a non-regular file is, in words an operator recognises.
_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class NotARegularFileError(OSError):
    """The path is a FIFO, a device or a socket: reading it could block or never end."""


class FileTooLargeError(OSError):
    """The file holds more than the caller's limit; ``limit`` says how many bytes that was."""

    def __init__(self, path: str, limit: int) -> None:
        super().__init__(errno.EFBIG, f"larger than {limit} bytes", path)
        self.limit = limit


def read_bytes(path: str | os.PathLike[str], limit: int) -> bytes:
    """The whole content of the regular file ``path``, at most ``limit`` bytes.

    Raises ``FileNotFoundError``, ``PermissionError``, ``IsADirectoryError``,
    ``NotARegularFileError``, ``FileTooLargeError`` or another ``OSError``; never blocks on
    the file's kind and never reads more than ``limit + 1`` bytes.
    """
    name = os.fspath(path)
    fd = _open_regular(name)
    try:
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(_CHUNK, limit + 1 - size))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
        raise FileTooLargeError(name, limit)
    finally:
        os.close(fd)


def require_regular_file(path: str | os.PathLike[str]) -> None:
    """Check, without reading it, that ``path`` is a regular file this process may open, for files a
    library reads itself (TLS certificates and keys, a kubeconfig): their ``open`` would block on a
    FIFO for ever. Raises what ``read_bytes`` raises, but never ``FileTooLargeError``."""
    os.close(_open_regular(os.fspath(path)))


def _open_regular(name: str) -> int:
    """A read-only descriptor of the regular file ``name``; ``O_NONBLOCK`` makes ``open`` of a FIFO
    return at once (regular files ignore the flag), so the kind is checked before anything waits."""
    fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory", name)
        if not stat.S_ISREG(mode):
            kind = next((what for test, what in _KINDS if test(mode)), "not a file")
            raise NotARegularFileError(errno.EINVAL, f"{kind}, not a regular file", name)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_text(path: str | os.PathLike[str], limit: int) -> str:
    """``read_bytes`` decoded as UTF-8; raises ``UnicodeDecodeError`` for anything else."""
    return read_bytes(path, limit).decode("utf-8")
