"""Reading a small YAML file that a person wrote: bounded, strict, errors of one line.

- ``read_text(path, max_bytes)`` reads a regular file only, at most ``max_bytes``, as UTF-8.
  Anything else is refused before a byte is read: ``/dev/zero`` would never end and a FIFO
  without a writer would block ``open()`` for ever (it is opened non-blocking, then checked).
- ``load(text)`` is PyYAML's safe loading, except that a key repeated in one mapping, at
  any depth, is an error: PyYAML silently keeps the last one, so a second
  ``basic_auth_users:`` block would quietly drop the first block's users.
- ``YamlFileError`` carries the problem without the file name (callers prefix their own
  label) and never quotes the file: PyYAML's own messages quote the offending line, which
  may hold a password hash.

The simulator's scenario reader (``sim/scenario_builder.py``) has its own copy of the
duplicate-key loader; the two are meant to become this one.
"""

from __future__ import annotations

import os
from typing import Any

import yaml

from . import boundedio


class YamlFileError(ValueError):
    """The file cannot be read or parsed; the message is one line, without the file's content."""


def read_text(path: str | os.PathLike[str], max_bytes: int) -> str:
    """The UTF-8 text of the regular file ``path``, refused when it is over ``max_bytes``
    (read through ``boundedio``, the one bounded file reader)."""
    try:
        raw = boundedio.read_bytes(path, max_bytes)
    except FileNotFoundError:
        raise YamlFileError("no such file") from None
    except IsADirectoryError:
        raise YamlFileError("is a directory, not a YAML file") from None
    except boundedio.NotARegularFileError as e:
        raise YamlFileError(f"{e.strerror}; give a YAML file") from None
    except boundedio.FileTooLargeError:
        size = f"{max_bytes >> 20} MiB" if max_bytes >= 1 << 20 else f"{max_bytes} bytes"
        raise YamlFileError(f"larger than {size}") from None
    except OSError as e:
        raise YamlFileError(f"cannot read it: {e.strerror}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise YamlFileError("not a UTF-8 text file") from None


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a repeated mapping key instead of keeping the last one."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            repeated = key in seen
            seen.add(key)
        except TypeError:  # an unhashable key (a list); SafeLoader refuses it below
            continue
        if repeated:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {str(key)[:64]!r}", key_node.start_mark)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load(text: str) -> Any:
    """The one YAML document in ``text`` (None when it is empty or only comments)."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.MarkedYAMLError as e:
        # The position and the problem only, never PyYAML's quote of the line.
        mark = e.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise YamlFileError(f"invalid YAML{where}: {e.problem or e.context}") from None
    except yaml.YAMLError:
        raise YamlFileError("invalid YAML") from None
    except RecursionError:
        raise YamlFileError("YAML nested too deeply") from None
