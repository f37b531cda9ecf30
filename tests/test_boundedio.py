"""The bounded file reader: whatever the path is, it costs at most its limit and never blocks."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from dra_exporter.boundedio import (
    FileTooLargeError,
    NotARegularFileError,
    read_bytes,
    read_text,
    require_regular_file,
)


def test_a_regular_file_up_to_the_limit_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 1000)
    assert read_bytes(path, 1000) == b"x" * 1000
    assert read_text(str(path), 5000) == "x" * 1000
    (tmp_path / "empty").write_bytes(b"")
    assert read_bytes(tmp_path / "empty", 10) == b""


def test_a_symlink_to_a_regular_file_is_followed(tmp_path: Path) -> None:
    # Kubernetes mounts ConfigMaps and Secrets as symlinks into a ..data directory.
    (tmp_path / "real").write_text("k: v\n")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert read_text(tmp_path / "link", 100) == "k: v\n"


def test_one_byte_over_the_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 1001)
    with pytest.raises(FileTooLargeError) as err:
        read_bytes(path, 1000)
    assert err.value.limit == 1000 and str(path) in str(err.value)


def test_a_file_whose_size_says_zero_is_still_read_only_up_to_the_limit() -> None:
    # Files under /proc report st_size 0 whatever they hold.
    status = Path("/proc/self/status")
    if not status.is_file():
        pytest.skip("no /proc")
    assert b"Pid:" in read_bytes(status, 1 << 20)
    with pytest.raises(FileTooLargeError):
        read_bytes(status, 10)


def test_dev_zero_is_refused_before_reading_a_byte() -> None:
    with pytest.raises(NotARegularFileError, match="a character device, not a regular file"):
        read_bytes("/dev/zero", 1 << 20)


def test_a_fifo_without_a_writer_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    # A plain open() of this FIFO blocks until a writer appears; the test would hang.
    with pytest.raises(NotARegularFileError, match=r"a FIFO \(named pipe\), not a regular file"):
        read_bytes(fifo, 1 << 20)


def test_a_socket_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        with pytest.raises(OSError, match="a socket, not a regular file|No such device"):
            read_bytes(path, 100)


def test_directories_and_missing_files_keep_their_usual_errors(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError):
        read_bytes(tmp_path, 100)
    with pytest.raises(FileNotFoundError):
        read_bytes(tmp_path / "nope", 100)


def test_text_that_is_not_utf8_is_a_decode_error(tmp_path: Path) -> None:
    path = tmp_path / "bin"
    path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UnicodeDecodeError):
        read_text(path, 100)


def test_no_descriptor_is_left_open(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big"
    big.write_bytes(b"x" * 100)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(50):
        for path in (fifo, big, tmp_path):
            with pytest.raises(OSError):
                read_bytes(path, 10)
    assert len(os.listdir("/proc/self/fd")) == before


def test_require_regular_file_checks_the_kind_without_reading(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big"
    big.write_bytes(b"x" * (1 << 20))
    require_regular_file(big)  # no size limit: the library reading it has its own
    with pytest.raises(NotARegularFileError, match="FIFO"):
        require_regular_file(fifo)
    with pytest.raises(NotARegularFileError, match="character device"):
        require_regular_file("/dev/null")
    with pytest.raises(IsADirectoryError):
        require_regular_file(tmp_path)
