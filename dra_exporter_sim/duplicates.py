"""Objects a dump holds twice: refused with one line naming both, instead of one silently winning.

The identity is the API server's: kind, namespace and name, compared as a tuple (a ``ns/name``
string would make the claims ``a/b`` + ``c`` and ``a`` + ``b/c`` one object). Two slices of one name
would otherwise lose a node's GPUs, two DeviceClasses of one name make either one the class.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .scenario import ScenarioError


def refuse_duplicates(objects: Iterable[Mapping[str, Any]], label: str) -> None:
    """Raise ``ScenarioError`` for the first object whose kind, namespace and name an earlier one has."""
    first: dict[tuple[str, str, str], int] = {}
    for number, obj in enumerate(objects, 1):
        meta = obj.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        namespace, name = meta.get("namespace") or "", meta.get("name") or ""
        identity = (str(obj.get("kind", "")), str(namespace), str(name))
        if identity in first:
            named = f"{identity[0]} {namespace!r}/{name!r}" if namespace else f"{identity[0]} {name!r}"
            raise ScenarioError(f"{label}: {named} is in the dump twice (objects {first[identity]} and {number} of "
                                "its DRA objects and pods); keep one")
        first[identity] = number
