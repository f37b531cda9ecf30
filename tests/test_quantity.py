"""The pure quantity parser against the Kubernetes client's (``kubernetes.utils.quantity``) on a corpus.

Equal, exactly, on every quantity the API server's grammar admits; where the client is laxer than
the server (NaN, infinity, blanks, underscores, ``K``), this parser refuses as the server does.
"""

from __future__ import annotations

import itertools
from decimal import Decimal, localcontext

import pytest
from kubernetes.utils.quantity import parse_quantity

from dra_exporter.quantity import MAX_LENGTH, parse, quantity

NUMBERS = ("0", "7", "12", "1.5", ".25", "3.", "+2", "-4", "0.000001", "1234567890123", "007")
SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E",
            "e3", "E3", "e-2", "E+0", "e12")
#: What the server accepts, from the docs and the simulator's objects.
EXAMPLES = ("80Gi", "1500m", "143771Mi", "100n", "1e3", "1E", "2.5Ki", "-0.5m", "64Gi", "48", "5e-1")
GRAMMAR = (*EXAMPLES, *(n + s for n, s in itertools.product(NUMBERS, SUFFIXES)))
#: The client reads these; the API server (and so this parser) refuses them.
ONLY_THE_CLIENT_READS = ("NaN", "inf", "-Infinity", " 12", "12 ", "1_000", "1K", "1e3k", "1.5e3Gi",
                         "1E3M", "sNaN", "1 Gi")
#: Neither reads these.
NEITHER_READS = ("", "lots", "Gi", "1Gb", "1.2.3", "--1", "1e", "e3", ".", "+", "1ki", "1mi", "0x10", "nan")


@pytest.mark.parametrize("text", GRAMMAR)
def test_equal_to_the_clients_on_every_quantity_of_the_grammar(text: str) -> None:
    with localcontext(prec=100):  # the client computes in the current context: 28 digits would round
        theirs = parse_quantity(text)
    assert parse(text) == theirs
    assert quantity(text) == float(theirs)


@pytest.mark.parametrize("text", ONLY_THE_CLIENT_READS)
def test_refuses_what_only_the_laxer_client_reads(text: str) -> None:
    parse_quantity(text)  # the client's answer, whatever it is: no exception
    assert parse(text) is None
    assert quantity(text) is None


@pytest.mark.parametrize("text", NEITHER_READS)
def test_refuses_what_neither_reads(text: str) -> None:
    with pytest.raises(ValueError):
        parse_quantity(text)
    assert parse(text) is None


def test_numbers_from_json_or_yaml_and_what_is_no_number() -> None:
    assert quantity(4) == 4.0
    assert quantity(2.5) == 2.5
    for bad in (True, False, None, [1], {"value": "1"}, float("nan"), float("inf"), 10**400):
        assert quantity(bad) is None


def test_values_past_a_float_and_overlong_texts_are_refused_not_infinite() -> None:
    assert parse("1e400") == Decimal("1e400")  # exact, as the client's
    assert quantity("1e400") is None  # but no finite float
    assert parse("1e99999999999") is None  # past Decimal's exponent range
    assert parse("1" * (MAX_LENGTH + 1)) is None
    assert parse("1" * MAX_LENGTH) == Decimal("1" * MAX_LENGTH)
