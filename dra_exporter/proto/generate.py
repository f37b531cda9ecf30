"""Regenerate the pod-resources Python modules from ``api.proto`` with grpcio-tools.

Usage: ``python -m dra_exporter.proto.generate [OUT_DIR]`` (default: this package).

The generated ``api_pb2.py``, ``api_pb2.pyi`` and ``api_pb2_grpc.py`` are committed so a
fresh clone needs no build step; ``tests/test_proto.py`` regenerates them into a temporary
directory and fails when the committed files differ, so never edit them by hand.

The proto is compiled as ``dra_exporter/proto/api.proto`` rather than a bare ``api.proto``:
that is the name it gets in protobuf's process-wide descriptor pool, and a generic name
would collide with any other library that also registers an ``api.proto``. protoc then
writes ``from dra_exporter.proto import api_pb2`` into the gRPC module; we rewrite it into a
package-relative import so the modules keep working if the package is vendored or renamed.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
PROTO_NAME = "api.proto"
#: Where the proto sits inside protoc's include root; also its descriptor-pool name.
PROTO_RELPATH = Path("dra_exporter") / "proto" / PROTO_NAME
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")

_ABSOLUTE_IMPORT = "from dra_exporter.proto import api_pb2 as "
_RELATIVE_IMPORT = "from . import api_pb2 as "


class GenerationError(RuntimeError):
    """protoc failed or produced output this script does not know how to fix up."""


def generate(out_dir: Path | str = PACKAGE_DIR, proto: Path | str | None = None) -> list[Path]:
    """Compile ``proto`` (default: this package's ``api.proto``) into ``out_dir``.

    Returns the written paths, in ``GENERATED`` order.
    """
    try:
        from grpc_tools import protoc  # a test/dev dependency only, so imported lazily
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise GenerationError("grpcio-tools is not installed: pip install 'grpcio-tools'") from exc

    source = Path(proto) if proto is not None else PACKAGE_DIR / PROTO_NAME
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dra-proto-") as tmp:
        root = Path(tmp)
        staged = root / PROTO_RELPATH
        staged.parent.mkdir(parents=True)
        shutil.copyfile(source, staged)
        args = [
            "grpc_tools.protoc",
            f"-I{root}",
            f"--python_out={root}",
            f"--pyi_out={root}",
            f"--grpc_python_out={root}",
            # An absolute path inside the include root: protoc names it by its path
            # relative to that root, without needing a chdir (which is process-wide).
            str(staged),
        ]
        code = protoc.main(args)
        if code != 0:
            raise GenerationError(f"protoc exited with status {code} compiling {source}")
        written = []
        for name in GENERATED:
            text = (staged.parent / name).read_text(encoding="utf-8")
            if name == "api_pb2_grpc.py":
                text = _make_import_relative(text)
            target = out / name
            target.write_text(text, encoding="utf-8")
            written.append(target)
    return written


def _make_import_relative(text: str) -> str:
    if _ABSOLUTE_IMPORT not in text:
        raise GenerationError(
            "generated api_pb2_grpc.py has no line starting with "
            f"{_ABSOLUTE_IMPORT!r}; grpcio-tools changed its output, update generate.py"
        )
    return text.replace(_ABSOLUTE_IMPORT, _RELATIVE_IMPORT, 1)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]) if args else PACKAGE_DIR
    try:
        for path in generate(out):
            print(path)
    except (GenerationError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
