"""Kubernetes resource quantities (``80Gi``, ``500m``, ``1e3``) as numbers in base units. Pure.

The grammar is the API server's (``k8s.io/apimachinery/pkg/api/resource``, ``ParseQuantity``)::

    quantity ::= [sign] number suffix
    number   ::= digits | digits "." [digits] | "." digits
    suffix   ::= binarySI | decimalSI | ("e" | "E") [sign] digits
    binarySI ::= Ki | Mi | Gi | Ti | Pi | Ei
    decimalSI::= n | u | m | "" | k | M | G | T | P | E

Written here rather than taken from ``kubernetes.utils.quantity`` for two reasons: that module
drags the whole Kubernetes client package in (``import kubernetes`` loads ``kubernetes.client``,
~45 MB of RSS), which the pure cores (the cluster mode's capacity arithmetic, its CEL selectors)
must not pay; and it is laxer than the server, reading what the API server refuses — ``nan``,
``inf``, ``1_000``, ``K``, surrounding blanks — so a dump or a hostile answer could bring NaN into
the counter arithmetic. ``tests/test_quantity.py`` checks both against a corpus: equal on every
quantity the grammar admits, and this one refusing the rest.
"""

from __future__ import annotations

import math
import re
from decimal import Context, Decimal, DecimalException
from typing import Final

_GRAMMAR: Final = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<binary>[KMGTPE]i)|[eE](?P<exponent>[+-]?[0-9]+)|(?P<decimal>[numkMGTPE]?))")
_BINARY: Final = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL: Final = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
#: Longest text read: the API server stores quantities as short strings; a megabyte of digits is
#: no quantity but costs the regular expression and Decimal time.
MAX_LENGTH: Final = 256
#: Exact arithmetic for every text up to MAX_LENGTH (``Decimal``'s default context rounds at 28 digits).
_EXACT: Final = Context(prec=2 * MAX_LENGTH)


def parse(text: str) -> Decimal | None:
    """The exact value of ``text`` in base units, or None when it is no quantity by the grammar."""
    if len(text) > MAX_LENGTH:
        return None
    match = _GRAMMAR.fullmatch(text)
    if match is None:
        return None
    number = Decimal(match["number"])
    try:
        if match["binary"] is not None:
            return _EXACT.multiply(number, 1024 ** _BINARY[match["binary"]])
        exponent = int(match["exponent"]) if match["exponent"] is not None else _DECIMAL[match["decimal"]]
        return _EXACT.scaleb(number, exponent)
    except DecimalException:  # an exponent past what the context holds
        return None


def quantity(value: object) -> float | None:
    """A quantity as a finite float in base units: a string by the grammar, or a JSON/YAML number
    (a dump may write ``memory: 80``); None for anything else, NaN, infinity, or a value past a float."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        number = float(value) if abs(value) < 2**1023 else math.inf
    elif isinstance(value, float):
        number = value
    elif isinstance(value, str):
        exact = parse(value)
        if exact is None:
            return None
        number = float(exact)
    else:
        return None
    return number if math.isfinite(number) else None
