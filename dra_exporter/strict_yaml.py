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

- Aliases that would repeat more than ``_MAX_ALIAS_VALUES`` values (an alias bomb) or that
  contain themselves are refused before anything is built.

Every YAML file the project reads goes through here: web-configs, scenarios, cluster dumps.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Final, TypeVar

import yaml

from . import boundedio

_T = TypeVar("_T")


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
    """SafeLoader that refuses a repeated mapping key instead of keeping the last one, and
    aliases that repeat more than ``_MAX_ALIAS_VALUES`` values or refer to themselves.

    PyYAML builds an alias as a reference to the one anchored object, so loading an alias
    bomb costs nothing; whatever walks or copies the result (a cluster dump's objects are
    copied) would expand it. The document's node graph is measured before anything is built.
    """

    def construct_document(self, node: yaml.Node) -> Any:
        _check_alias_expansion(node)
        return super().construct_document(node)


#: Values that aliases may add to a document by repeating anchored ones; a 4 MiB file holds
#: about two million values without any, and a scenario that shares a few curves needs far fewer.
_MAX_ALIAS_VALUES: Final = 100_000


def _check_alias_expansion(root: yaml.Node) -> None:
    """Refuse a node graph whose expansion (every alias replaced by a copy) is too large or infinite.

    One iterative post-order walk with each node's expanded size memoised: linear in the
    number of distinct nodes, however large the expansion would be.
    """
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in _children(node))
            continue
        if key in size:
            continue
        if key in on_path:
            raise yaml.constructor.ConstructorError(
                None, None, "an alias refers to a value that contains it (a recursive alias)",
                node.start_mark)
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in size)
    added = size[id(root)] - len(size)
    if added > _MAX_ALIAS_VALUES:
        raise yaml.constructor.ConstructorError(
            None, None, f"aliases repeat anchored values {added:,} times over (at most "
            f"{_MAX_ALIAS_VALUES:,} are accepted: an alias bomb?)", root.start_mark)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


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
    return _errors(lambda: yaml.load(text, Loader=_StrictLoader))  # noqa: S506 - a SafeLoader subclass


def load_all(text: str) -> list[Any]:
    """Every document of a multi-document YAML text (``[]`` for an empty one)."""
    return _errors(lambda: list(yaml.load_all(text, Loader=_StrictLoader)))  # noqa: S506 - SafeLoader subclass


def _errors(load: Callable[[], _T]) -> _T:
    try:
        return load()
    except yaml.MarkedYAMLError as e:
        # The position and the problem only, never PyYAML's quote of the line.
        mark = e.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise YamlFileError(f"invalid YAML{where}: {e.problem or e.context}") from None
    except yaml.YAMLError:
        raise YamlFileError("invalid YAML") from None
    except RecursionError:
        raise YamlFileError("YAML nested too deeply") from None
