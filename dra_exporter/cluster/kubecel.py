"""Kubernetes' CEL environment for DRA selectors, over the ``cel`` library (``common-expression-language``).

What the API server and the scheduler compile DeviceClass and request selectors with (read from
Kubernetes v1.36's ``dynamic-resource-allocation/cel`` and confirmed on the test bed's API server,
which admits or refuses each form): the Kubernetes base library (strings v2, lists, sets, regex,
optional types, quantity, semver, IP/CIDR, URL, format) plus ``cel.bind``; and at run time an
attribute or capacity domain a device does not have reads as an empty map, not an error.

What the ``cel`` library lacks is filled in here, the rest reported as not supported:

- ``add_stdlib_to_context``'s libraries (the package's own pure-Python ``charAt``, ``indexOf``,
  ``lowerAscii``, ``split``, ``join``, ``sets.*``, ``sort``, ``min``/``max``/``sum`` …) are used as
  they are; functions the API server does not declare (``math.*``, ``base64.*``) are harmless here,
  as a selector that calls one is refused at admission and never reaches the exporter.
- Written here, because the library has no equivalent: ``cel.bind`` and optional field/index
  selection (``x.?f``, ``m[?k]``) are *syntax* its parser refuses, so the source is rewritten
  before it is compiled (``translate``): ``cel.bind(v, init, body)`` becomes ``[init].map(v, body)[0]``
  (the comprehension cel-go expands ``bind`` into, evaluated once, as there), ``x.?f`` a call of a
  function that returns an ``optional``; the ``optional`` values themselves (``orValue``, ``hasValue``,
  ``value``, ``or``) are the library's. ``string.format`` (cel-go's verbs), ``find``/``findAll``,
  ``isSorted`` and the list forms of ``indexOf``/``lastIndexOf`` are functions below.
- The empty map for an unknown domain (``translate``): the literally indexed domains are added to
  the device, or, where the maps are also used otherwise (``'d' in device.attributes``), each index
  becomes a lookup that returns an empty map for a domain the device lacks, as the scheduler's map
  does, while membership and iteration see only the device's own domains. Not covered: the maps
  indexed through a variable (``cel.bind(a, device.attributes, a['d'])``), where a missing domain
  stays an error.
- IP and CIDR values are their canonical text (``ip('10.0.0.1').family()``,
  ``cidr('10.0.0.0/8').containsIP(...)``, ``isIP``/``isCIDR``, ``prefixLength``, ``masked`` …), with
  Python's ``ipaddress`` (zones and IPv4-mapped IPv6 refused, as Kubernetes' library does).
- Not supported (the class is reported "not supported by this exporter", never "not placeable"):
  URL and ``format.*`` named formats, two-variable comprehensions, ``transformMap`` and
  ``transformList``, optional list and map literal elements, and anything else the library cannot
  parse or run.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any, Final

import cel
from cel.stdlib import add_stdlib_to_context

#: What every message about a selector the exporter cannot run starts with.
UNSUPPORTED: Final = "not supported by this exporter: "
#: Rewrites one expression may need before it is refused (each is a pass over the source).
MAX_REWRITES: Final = 256
_OPTIONAL_FIELD: Final = "dra_exporter_optional_field"
_OPTIONAL_INDEX: Final = "dra_exporter_optional_index"
_DOMAIN: Final = "dra_exporter_domain"
_OPTIONAL_DOMAIN: Final = "dra_exporter_optional_domain"

_TOKEN: Final = re.compile(r"""
    (?P<str>[rRbB]{0,2}(?:'''(?:\\.|[^\\])*?'''|\"\"\"(?:\\.|[^\\])*?\"\"\"|'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*"))
  | (?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?[uU]?|0[xX][0-9a-fA-F]+[uU]?)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<space>\s+|//[^\n]*)
  | (?P<punct>.)
""", re.VERBOSE | re.DOTALL)


# The library logs a warning each time a Python function raises: here that is a device failing a
# selector (a substring out of range), which the exporter reports itself, once per class.
logging.getLogger("cel").setLevel(logging.ERROR)


class Unsupported(ValueError):
    """The expression uses a form of Kubernetes' CEL the exporter does not run."""


# --- the source: what the parser cannot read, rewritten ---------------------------------------------


def _tokens(source: str) -> list[tuple[str, str, int, int]]:
    """(kind, text, start, end) of each token, white space and comments left out."""
    out = []
    for m in _TOKEN.finditer(source):
        kind = m.lastgroup or "punct"
        if kind != "space":
            out.append((kind, m.group(), m.start(), m.end()))
    return out


def _closing(tokens: list[tuple[str, str, int, int]], opening: int) -> int:
    """Index of the token that closes the bracket at ``opening``."""
    depth = 0
    for i in range(opening, len(tokens)):
        kind, text = tokens[i][0], tokens[i][1]
        if kind == "punct" and text in "([{":
            depth += 1
        elif kind == "punct" and text in ")]}":
            depth -= 1
            if depth == 0:
                return i
    raise Unsupported("unbalanced brackets")


def _arguments(tokens: list[tuple[str, str, int, int]], opening: int, closing: int) -> list[tuple[int, int]]:
    """(first, last) token indexes of each top-level argument between two brackets."""
    args, depth, first = [], 0, opening + 1
    for i in range(opening + 1, closing):
        kind, text = tokens[i][0], tokens[i][1]
        if kind != "punct":
            continue
        if text in "([{":
            depth += 1
        elif text in ")]}":
            depth -= 1
        elif text == "," and depth == 0:
            args.append((first, i - 1))
            first = i + 1
    args.append((first, closing - 1))
    return args


def _rewrite_once(source: str, lookups: bool) -> str | None:
    """The source with its first ``cel.bind`` or optional selection (with ``lookups``, also domain
    index) rewritten; None when it has none."""
    tokens = _tokens(source)

    def text(first: int, last: int) -> str:
        return source[tokens[first][2]:tokens[last][3]]

    for i, (kind, tok, start, _end) in enumerate(tokens):
        if kind != "punct":
            continue
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        after = tokens[i + 2] if i + 2 < len(tokens) else None
        if (tok == "." and nxt is not None and nxt[1] == "bind" and i > 0 and tokens[i - 1][1] == "cel"
                and after is not None and after[1] == "("):
            closing = _closing(tokens, i + 2)
            args = _arguments(tokens, i + 2, closing)
            if len(args) != 3 or args[0][0] != args[0][1] or tokens[args[0][0]][0] != "ident":
                raise Unsupported("cel.bind takes a variable name, a value and an expression")
            name, init, body = tokens[args[0][0]][1], text(*args[1]), text(*args[2])
            begin = tokens[i - 1][2]
            return f"{source[:begin]}[{init}].map({name}, {body})[0]{source[tokens[closing][3]:]}"
        if tok == "." and nxt is not None and nxt[1] == "?" and after is not None and after[0] == "ident":
            return f"{source[:start]}.{_OPTIONAL_FIELD}('{after[1]}'){source[after[3]:]}"
        if (lookups and tok == "[" and i > 1 and nxt is not None and tokens[i - 2][1] == "."
                and tokens[i - 1][0] == "ident" and tokens[i - 1][1] in ("attributes", "capacity")):
            closing = _closing(tokens, i)
            optional = nxt[1] == "?"
            key = text(i + 2 if optional else i + 1, closing - 1)
            function = _OPTIONAL_DOMAIN if optional else _DOMAIN
            return f"{source[:start]}.{function}({key}){source[tokens[closing][3]:]}"
        if tok == "[" and nxt is not None and nxt[1] == "?":
            before = tokens[i - 1] if i > 0 else None
            if before is None or not (before[0] in ("ident", "str", "num") or before[1] in (")", "]", "}")):
                raise Unsupported("optional elements of a list literal")
            closing = _closing(tokens, i)
            key = text(i + 2, closing - 1)
            return f"{source[:start]}.{_OPTIONAL_INDEX}({key}){source[tokens[closing][3]:]}"
        if tok == "{" and nxt is not None and nxt[1] == "?":
            raise Unsupported("optional entries of a map literal")
    return None


def translate(expression: str) -> tuple[str, tuple[str, ...]]:
    """The expression in the form the ``cel`` library parses, and the domains to add to a device as
    empty maps where it lacks them (raises ``Unsupported``).

    An unknown domain reads as an empty map two ways: when every use of ``.attributes`` and
    ``.capacity`` is an index by a plain string literal (the usual selector), those domains are
    added to the device it runs over (no cost); otherwise (``'d' in device.attributes``, iteration, a
    computed domain) each index becomes a lookup function, as exact as the scheduler's map and
    slower (the whole map crosses into Python per lookup: ~50 µs)."""
    domains = _literal_domains(expression)
    source = expression
    for _ in range(MAX_REWRITES):
        rewritten = _rewrite_once(source, lookups=domains is None)
        if rewritten is None:
            return source, domains or ()
        source = rewritten
    raise Unsupported(f"more than {MAX_REWRITES} cel.bind and optional selections")


_PLAIN_STRING: Final = re.compile(r"""'[^'\\\n]*'|"[^"\\\n]*\"""")


def _literal_domains(expression: str) -> tuple[str, ...] | None:
    """The domains indexed when ``.attributes``/``.capacity`` are only ever indexed by a plain string
    literal (``[?'d']`` too); None when they are used any other way."""
    tokens = _tokens(expression)
    domains = set()
    for i, (kind, text, _start, _end) in enumerate(tokens):
        if kind != "ident" or text not in ("attributes", "capacity") or i == 0 or tokens[i - 1][1] != ".":
            continue
        rest = [t[1] for t in tokens[i + 1:i + 5]]
        if rest[:1] == ["["] and rest[1:2] == ["?"]:
            rest = rest[:1] + rest[2:]
        if len(rest) < 3 or rest[0] != "[" or rest[2] != "]" or not _PLAIN_STRING.fullmatch(rest[1]):
            return None
        domains.add(rest[1][1:-1])
    return tuple(sorted(domains))


def with_domains(view: dict[str, Any], domains: tuple[str, ...]) -> dict[str, Any]:
    """The ``device`` view with an empty map for each of ``domains`` it has no attributes or capacity
    of (a copy when one is missing: the view itself is shared)."""
    attributes, capacity = view["attributes"], view["capacity"]
    if all(d in attributes and d in capacity for d in domains):
        return view
    return {**view, "attributes": {**dict.fromkeys(domains, {}), **attributes},
            "capacity": {**dict.fromkeys(domains, {}), **capacity}}


# --- the functions the library lacks ------------------------------------------------------------------


def _domain(domains: Any, name: Any) -> Any:
    """``device.attributes[name]`` / ``device.capacity[name]``: an empty map for a domain the device lacks."""
    if not isinstance(domains, dict) or not isinstance(name, str):
        raise TypeError("a domain is looked up by its name")
    return domains.get(name, {})


def _optional_domain(domains: Any, name: Any) -> Any:
    """``device.attributes[?name]``: the lookup above finds every name, so it always has a value."""
    return cel.OptionalValue.of(_domain(domains, name))


def _optional_field(target: Any, name: str) -> Any:
    if isinstance(target, cel.OptionalValue):
        if not target.has_value():
            return target
        target = target.value()
    if not isinstance(target, dict):
        raise TypeError(f"no field selection on {type(target).__name__}")
    return cel.OptionalValue.of(target[name]) if name in target else cel.OptionalValue.none()


def _optional_index(target: Any, key: Any) -> Any:
    if isinstance(target, cel.OptionalValue):
        if not target.has_value():
            return target
        target = target.value()
    if isinstance(target, dict):
        return cel.OptionalValue.of(target[key]) if key in target else cel.OptionalValue.none()
    if isinstance(target, list) and isinstance(key, int) and not isinstance(key, bool):
        return cel.OptionalValue.of(target[key]) if 0 <= key < len(target) else cel.OptionalValue.none()
    raise TypeError(f"no index of {type(target).__name__} by {type(key).__name__}")


def _format_value(verb: str, value: Any, precision: int | None) -> str:
    """One verb of cel-go's ``string.format``."""
    if verb == "s":
        return _as_string(value)
    if verb == "d":
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"%d takes an integer, not {type(value).__name__}")
        return str(value)
    if verb in "fe":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"%{verb} takes a number, not {type(value).__name__}")
        digits = 6 if precision is None else precision
        return f"{float(value):.{digits}{verb}}"
    if verb in "boxX":
        if isinstance(value, bool) or not isinstance(value, (int, str, bytes)):
            raise TypeError(f"%{verb} takes an integer, not {type(value).__name__}")
        if isinstance(value, int):
            text = format(value, verb)
        elif verb in "xX":
            raw = value.encode() if isinstance(value, str) else value
            text = raw.hex().upper() if verb == "X" else raw.hex()
        else:
            raise TypeError(f"%{verb} takes an integer")
        return text
    raise ValueError(f"unknown format verb %{verb}")


def _as_string(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "[" + ", ".join(_as_string(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_as_string(k)}: {_as_string(v)}" for k, v in value.items()) + "}"
    if value is None:
        return "null"
    return str(value)


_VERB: Final = re.compile(r"%(?:\.(\d+))?([a-zA-Z%])")


def _format(template: str, args: Any) -> str:
    if not isinstance(template, str) or not isinstance(args, list):
        raise TypeError("format takes a string and a list")
    values: Iterator[Any] = iter(args)
    used = 0

    def one(m: re.Match[str]) -> str:
        nonlocal used
        if m[2] == "%":
            return "%"
        used += 1
        try:
            value = next(values)
        except StopIteration:
            raise ValueError(f"format: {used} verbs, {len(args)} arguments") from None
        return _format_value(m[2], value, int(m[1]) if m[1] is not None else None)

    out = _VERB.sub(one, template)
    if used != len(args):
        raise ValueError(f"format: {used} verbs, {len(args)} arguments")
    return out


def _index_of(target: Any, item: Any, *rest: Any) -> Any:
    if isinstance(target, list):
        return next((i for i, v in enumerate(target) if type(v) is type(item) and v == item), -1)
    return _STRINGS["indexOf"](target, item, *rest)


def _last_index_of(target: Any, item: Any, *rest: Any) -> Any:
    if isinstance(target, list):
        return next((i for i in range(len(target) - 1, -1, -1)
                     if type(target[i]) is type(item) and target[i] == item), -1)
    return _STRINGS["lastIndexOf"](target, item, *rest)


def _find(text: Any, pattern: Any) -> str:
    m = re.search(pattern, text)
    return m.group() if m else ""


def _find_all(text: Any, pattern: Any, limit: int = -1) -> list[str]:
    found = [m.group() for m in re.finditer(pattern, text)]
    return found if limit < 0 else found[:limit]


def _is_sorted(items: Any) -> bool:
    if not isinstance(items, list):
        raise TypeError("isSorted takes a list")
    return all(a <= b for a, b in zip(items, items[1:], strict=False))


def succeeds(check: Callable[[Any], Any]) -> Callable[[Any], bool]:
    """``isX(value)`` from the conversion ``x(value)``: whether it succeeds."""
    def test(value: Any) -> bool:
        try:
            check(value)
        except (TypeError, ValueError):
            return False
        return True
    return test


def _address(text: Any) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An IP address as Kubernetes' ``ip()`` takes it: no zone, no IPv4-mapped IPv6 form."""
    if not isinstance(text, str) or "%" in text:
        raise ValueError(f"not an IP address: {text!r}")
    address = ipaddress.ip_address(text)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        raise ValueError(f"IPv4-mapped IPv6 address: {text!r}")
    return address


def _network(text: Any) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface:
    if not isinstance(text, str) or "/" not in text:
        raise ValueError(f"not a CIDR: {text!r}")
    address, _, _prefix = text.partition("/")
    _address(address)
    return ipaddress.ip_interface(text)


def _ip(text: Any) -> str:
    """``ip(s)``, and ``cidr.ip()``: IP values are their canonical text here."""
    if isinstance(text, str) and "/" in text:
        return str(_network(text).ip)
    return str(_address(text))


def _contains_ip(cidr: Any, address: Any) -> bool:
    return _address(address) in _network(cidr).network


def _contains_cidr(cidr: Any, other: Any) -> bool:
    inner = _network(other).network
    outer = _network(cidr).network
    return inner.version == outer.version and inner.subnet_of(outer)  # type: ignore[arg-type]


def _link_local_multicast(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    packed = address.packed
    if address.version == 4:
        return packed[:3] == bytes((224, 0, 0))
    return packed[0] == 0xFF and packed[1] & 0x0F == 0x02  # any flags, link-local scope (as Go's net.IP)


def _global_unicast(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return not (address.is_multicast or address.is_loopback or address.is_link_local or address.is_unspecified
                or str(address) == "255.255.255.255")


_IP_FUNCTIONS: Final[dict[str, Callable[..., Any]]] = {
    "isIP": succeeds(_address), "ip": _ip, "isCIDR": succeeds(_network), "cidr": lambda t: str(_network(t)),
    "family": lambda t: _address(t).version,
    "isLoopback": lambda t: _address(t).is_loopback,
    "isUnspecified": lambda t: _address(t).is_unspecified,
    "isLinkLocalUnicast": lambda t: _address(t).is_link_local,
    "isLinkLocalMulticast": lambda t: _link_local_multicast(_address(t)),
    "isGlobalUnicast": lambda t: _global_unicast(_address(t)),
    "containsIP": _contains_ip, "containsCIDR": _contains_cidr,
    "prefixLength": lambda t: _network(t).network.prefixlen,
    "masked": lambda t: str(_network(t).network),
}


def _library() -> dict[str, Callable[..., Any]]:
    context = cel.Context()
    add_stdlib_to_context(context)
    return dict(context.functions)


_STRINGS: Final = _library()
#: Functions a selector may call beyond the library's built-ins, by name.
LIBRARY: Final[dict[str, Callable[..., Any]]] = {
    **_STRINGS,
    "format": _format, "indexOf": _index_of, "lastIndexOf": _last_index_of, "find": _find, "findAll": _find_all,
    "isSorted": _is_sorted, _OPTIONAL_FIELD: _optional_field, _OPTIONAL_INDEX: _optional_index, **_IP_FUNCTIONS,
    _DOMAIN: _domain, _OPTIONAL_DOMAIN: _optional_domain,
}
