"""DeviceClass CEL selectors, evaluated over slice devices as the scheduler does.

Contract: ``ClassSelector(device_class).matches(driver, device)`` says whether a device meets every
``spec.selectors[].cel.expression`` of the class (True/False), or None when the expression failed
for that device (a missing attribute, a type error: the scheduler does not allocate such a device
either). A class whose expressions the library cannot run at all (syntax it does not parse, a
function it does not know) has ``error`` set and matches nothing; it is reported, never a crash.

The CEL runtime is ``common-expression-language`` (Rust bindings, ``import cel``): of the maintained
Python libraries it is the fastest here (~15 µs an evaluation against ~300-600 µs for the pure-Python
``cel-python``), and it calls Python functions with the receiver first, so the Kubernetes CEL
library's functions are registered by hand below: ``semver()``, ``isSemver()``, ``quantity()``,
``isQuantity()``, ``compareTo``, ``isGreaterThan``, ``isLessThan``, ``major``/``minor``/``patch``,
``asInteger``, ``asApproximateFloat``, ``add``, ``sub``. Quantities are plain numbers in base units
and versions plain strings (the library passes only its own value types): ``compareTo`` and friends
compare numbers as numbers and strings as semantic versions. The rest of Kubernetes' environment
(strings, lists, sets, optionals, ``cel.bind``, the empty map of an unknown domain) is
``kubecel``'s; a selector neither runs is refused with ``UNSUPPORTED`` first ("not supported by this
exporter": the scheduler runs it, so no verdict either way). What this does not do that the API
server does: type-check at admission (a string attribute compared with ``isGreaterThan`` is compared
as a version here, not rejected) and a static cost estimate (a time limit stands in: below).

Cost: a device's result depends only on the attributes and capacities the expression names. When
every ``device.attributes[...]``/``device.capacity[...]`` use is a literal ``['domain'].name`` (the
usual class), results are memoised by the driver and those values, so 40,000 GPUs of ten models cost
ten evaluations; otherwise by the whole device. One ``MemoBudget`` bounds the memoised results of all
classes together (a class each for 300 teams must not hold a result per device each).

What a hostile class can do is bounded as the API server bounds it: an expression over
``MAX_EXPRESSION_BYTES`` (the server's ``CELSelectorExpressionMaxLength``) is refused before the
library sees it (longer ones crash it: 20,000 terms overflow its stack, a column past 65,535 panics,
1.5 MB take 2 GB to compile). The library has no cost counter and holds the GIL while it evaluates,
so the scheduler's runtime cost limit is enforced as a time limit by the engine that runs the
programs: ``InProcessEngine`` here (tests, one-shot tools) or the cluster mode's worker process
(``cluster/cel_worker.py``), which a runaway or crashing evaluation cannot stop. A class that
exceeds it is refused as a whole (``error``), as one the scheduler cannot evaluate.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

import cel

from ..model import DeviceClassInfo, SliceDevice
from ..quantity import quantity
from .kubecel import LIBRARY, UNSUPPORTED, Unsupported, succeeds, translate, with_domains

#: ``device.attributes['dom'].name`` / ``device.capacity["dom"]["name"]``: a literal reference.
_REFERENCE: Final = re.compile(
    r"""device\s*\.\s*(attributes|capacity)\s*\[\s*(['"])([^'"]+)\2\s*\]\s*"""
    r"""(?:\.\s*([A-Za-z_][A-Za-z0-9_]*)|\[\s*(['"])([^'"]+)\5\s*\])""")
_ANY_MAP: Final = re.compile(r"\b(attributes|capacity)\b")
#: Memoised results kept for all classes together (~200 bytes each: a bound of ~50 MB).
MAX_MEMO: Final = 250_000
#: ``resource.k8s.io`` ``CELSelectorExpressionMaxLength``: the API server refuses longer selectors.
MAX_EXPRESSION_BYTES: Final = 10 * 1024
_UNKNOWN_FUNCTION: Final = "Undefined variable or function"
#: Compiled expression sets an engine keeps; past it they are dropped and compiled again when asked
#: (classes change rarely: a bound against churn, not a cache size that matters).
MAX_PROGRAMS: Final = 1_000
#: What the library's errors must never swallow (its Rust panics derive from BaseException too).
_FATAL: Final = (KeyboardInterrupt, SystemExit, GeneratorExit)

Verdict = bool | None | str
"""What running a class's programs over one device gives: True (every expression holds), False
(one is false), None (one failed for this device: a missing attribute, a type error), or a string:
the class cannot be run at all (the message)."""


class Interrupted(str):
    """A failure of the run, not of the class: the worker was killed or could not start, or an
    evaluation ran past the time limit (a loaded CPU can push an honest class there). Retried on a
    later frame (``cel_budget``), never kept as the class's answer."""


def _semver_key(text: Any) -> tuple[int, int, int, tuple[tuple[int, int | str], ...]]:
    """Semantic-version order (semver 2.0: pre-releases sort before the release; build ignored)."""
    if not isinstance(text, str):
        raise TypeError(f"not a version: {text!r}")
    core, _, pre = text.split("+", 1)[0].partition("-")
    parts = core.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"not a semantic version: {text!r}")
    ids = tuple((0, int(p)) if p.isdigit() else (1, p) for p in pre.split(".")) if pre else ()
    major, minor, patch = (int(p) for p in parts)
    # A release sorts after all its pre-releases: mark it with a sentinel larger than any id.
    return major, minor, patch, ids or ((2, 0),)


def _compare(a: Any, b: Any) -> int:
    if isinstance(a, str) or isinstance(b, str):
        ka, kb = _semver_key(a), _semver_key(b)
        return (ka > kb) - (ka < kb)
    if isinstance(a, bool) or isinstance(b, bool):
        raise TypeError("no ordering of booleans")
    return int(a > b) - int(a < b)


def _semver(text: Any) -> str:
    _semver_key(text)
    return str(text)


def _quantity(text: Any) -> float:
    number = quantity(text)
    if number is None:
        raise ValueError(f"not a quantity: {text!r}")
    return number


#: The Kubernetes CEL library functions DeviceClass selectors use, over this module's value forms.
FUNCTIONS: Final[dict[str, Callable[..., Any]]] = {
    "semver": _semver,
    "isSemver": succeeds(_semver_key),
    "quantity": _quantity,
    "isQuantity": succeeds(_quantity),
    "compareTo": _compare,
    "isGreaterThan": lambda a, b: _compare(a, b) > 0,
    "isLessThan": lambda a, b: _compare(a, b) < 0,
    "major": lambda v: _semver_key(v)[0],
    "minor": lambda v: _semver_key(v)[1],
    "patch": lambda v: _semver_key(v)[2],
    "asInteger": lambda q: int(q),
    "asApproximateFloat": lambda q: float(q),
    "add": lambda a, b: a + (_quantity(b) if isinstance(b, str) else b),
    "sub": lambda a, b: a - (_quantity(b) if isinstance(b, str) else b),
}
#: Everything a selector may call beyond the library's built-ins (Kubernetes' own functions win).
_FUNCTIONS: Final = {**LIBRARY, **FUNCTIONS}


def _typed(text: str, kind: str) -> Any:
    """An attribute's value as CEL sees it, from the normalised text and its union member."""
    if kind == "int":
        return int(text)
    if kind == "bool":
        return text == "true"
    if kind in ("ints", "bools", "strings", "versions"):
        items = text.split(",") if text else []
        return [_typed(i, kind[:-1]) for i in items]
    return text  # string, version


def _split(key: str, driver: str) -> tuple[str, str]:
    """(domain, name) of a normalised key: keys of the driver's own domain lost it."""
    domain, sep, name = key.rpartition("/")
    return (domain, name) if sep else (driver, key)


def device_view(driver: str, device: SliceDevice) -> dict[str, Any]:
    """The ``device`` variable of a selector: driver, attributes and capacity by domain."""
    kinds = dict(device.attribute_kinds)
    attributes: dict[str, dict[str, Any]] = {}
    for key, text in device.attributes:
        domain, name = _split(key, driver)
        try:
            attributes.setdefault(domain, {})[name] = _typed(text, kinds.get(key, "string"))
        except ValueError:
            continue  # an int that is not one: left out, as a value the API would have refused
    capacity: dict[str, dict[str, Any]] = {}
    for key, value in device.capacity:
        domain, name = _split(key, driver)
        capacity.setdefault(domain, {})[name] = value
    return {"driver": driver, "attributes": attributes, "capacity": capacity,
            "allowMultipleAllocations": device.allow_multiple_allocations}


def refusal(expression: str) -> str:
    """Why the API server would refuse this selector before any evaluation ("" when it would not)."""
    size = len(expression.encode("utf-8", "surrogatepass"))
    if size > MAX_EXPRESSION_BYTES:
        return f"expression of {size} bytes exceeds the API server's limit of {MAX_EXPRESSION_BYTES}"
    return ""


def compile_programs(expressions: Sequence[str]) -> list[Any] | str:
    """The compiled programs of a class's expressions, or why they cannot be compiled (one line;
    ``UNSUPPORTED`` first when the API server would run it and this exporter cannot)."""
    programs = []
    for expression in expressions:
        if why := refusal(expression):
            return why
        try:
            source, domains = translate(expression)
            program = cel.compile(source)
            # Only the functions it calls: the library converts every entry of the context per run.
            called = set(program.functions())
            called |= {f"{v}.{c}" for v in program.variables() for c in called}  # ``sets.contains``
            functions = {name: f for name, f in _FUNCTIONS.items() if name in called}
            programs.append((program, domains, functions))
        except _FATAL:
            raise
        except Unsupported as exc:
            return UNSUPPORTED + str(exc)
        except BaseException as exc:  # noqa: BLE001 - ValueError and others; a Rust panic is a BaseException
            return UNSUPPORTED + _first_line(exc)
    return programs


def run_programs(programs: Sequence[Any], view: dict[str, Any]) -> Verdict:
    """Every program over one device's ``device`` variable (see ``Verdict``)."""
    for program, domains, functions in programs:
        try:
            result = program.execute({"device": with_domains(view, domains) if domains else view, **functions})
        except RuntimeError as exc:
            if _UNKNOWN_FUNCTION in str(exc):
                return UNSUPPORTED + _first_line(exc)  # the library cannot run it for any device
            return None
        except _FATAL:
            raise
        except BaseException:  # noqa: BLE001 - KeyError, TypeError, ValueError, a panic: this device fails it
            return None
        if result is not True:
            return None if not isinstance(result, bool) else False
    return True


def unsupported(why: str) -> bool:
    """Whether a class's error says the exporter cannot run it (where the scheduler can)."""
    return why.startswith(UNSUPPORTED)


class CelEngine(Protocol):
    """Runs a class's expressions (compiled once per engine): where, and within what bound, is the
    engine's business (in this process, or in a worker process that a runaway cannot stop)."""

    def check(self, name: str, expressions: tuple[str, ...]) -> str:
        """"" when the expressions of class ``name`` compile, else why not (one line)."""
        ...

    def evaluate(self, name: str, expressions: tuple[str, ...], view: dict[str, Any]) -> Verdict:
        ...


class InProcessEngine:
    """Compiles and evaluates in this process, without a time limit: for tests and tools that run
    one evaluation at a time; the cluster mode uses the worker process."""

    def __init__(self) -> None:
        self._programs: dict[tuple[str, ...], list[Any] | str] = {}

    def _compiled(self, expressions: tuple[str, ...]) -> list[Any] | str:
        found = self._programs.get(expressions)
        if found is None:
            if len(self._programs) >= MAX_PROGRAMS:
                self._programs.clear()
            found = self._programs[expressions] = compile_programs(expressions)
        return found

    def check(self, name: str, expressions: tuple[str, ...]) -> str:
        found = self._compiled(expressions)
        return found if isinstance(found, str) else ""

    def evaluate(self, name: str, expressions: tuple[str, ...], view: dict[str, Any]) -> Verdict:
        found = self._compiled(expressions)
        return found if isinstance(found, str) else run_programs(found, view)


class MemoBudget:
    """How many memoised results all selectors together may keep; a selector's share comes back
    when it is dropped (a class changed or deleted)."""

    def __init__(self, limit: int = MAX_MEMO) -> None:
        self.limit = limit
        self.used = 0

    def take(self) -> bool:
        if self.used >= self.limit:
            return False
        self.used += 1
        return True

    def give_back(self, count: int) -> None:
        self.used = max(0, self.used - count)


_IN_PROCESS: Final = InProcessEngine()
_SHARED_BUDGET: Final = MemoBudget()


class ClassSelector:
    """The compiled selectors of one DeviceClass; see the module docstring."""

    def __init__(self, device_class: DeviceClassInfo, engine: CelEngine | None = None,
                 budget: MemoBudget | None = None) -> None:
        self.name = device_class.name
        self._expressions = tuple(device_class.selectors)
        self._engine = engine if engine is not None else _IN_PROCESS
        self._budget = budget if budget is not None else _SHARED_BUDGET
        self._references: list[tuple[str, str, str]] | None = []
        self._memo: dict[Any, bool | None] = {}
        # The memo's share of the budget comes back however the selector goes.
        weakref.finalize(self, _release, self._budget, self._memo)
        self.error = self._engine.check(self.name, self._expressions) if self._expressions else ""
        if self.error:
            return
        for expression in self._expressions:
            refs = [(m[1], m[3], m[4] or m[6]) for m in _REFERENCE.finditer(expression)]
            if self._references is not None and len(refs) == len(_ANY_MAP.findall(expression)):
                self._references.extend(refs)
            else:
                self._references = None  # a reference the pattern does not cover: memoise by device

    @property
    def unsupported(self) -> bool:
        """Refused because the exporter cannot run it, not because the scheduler would refuse it."""
        return unsupported(self.error)

    def matches(self, driver: str, device: SliceDevice) -> bool | None:
        if self.error:
            return False
        if not self._expressions:
            return True  # a class without selectors takes every device
        key = self._key(driver, device)
        if key in self._memo:
            return self._memo[key]
        verdict = self._engine.evaluate(self.name, self._expressions, device_view(driver, device))
        if isinstance(verdict, str):
            self.error = verdict  # refused as a whole: what is memoised no longer matters
            _release(self._budget, self._memo)
            return False
        if self._budget.take():
            self._memo[key] = verdict
        return verdict

    def memoised(self, driver: str, device: SliceDevice) -> bool:
        """Whether ``matches`` has this device's answer without running CEL."""
        return bool(self.error) or not self._expressions or self._key(driver, device) in self._memo

    def _key(self, driver: str, device: SliceDevice) -> Any:
        if self._references is None:
            return driver, device.attributes, device.attribute_kinds, device.capacity, device.allow_multiple_allocations
        attrs, caps, kinds = dict(device.attributes), dict(device.capacity), dict(device.attribute_kinds)
        values: list[Any] = []
        for kind, domain, name in self._references:
            key = name if domain == driver else f"{domain}/{name}"
            values.append((attrs.get(key), kinds.get(key)) if kind == "attributes" else caps.get(key))
        return driver, tuple(values), device.allow_multiple_allocations


def _release(budget: MemoBudget, memo: dict[Any, bool | None]) -> None:
    budget.give_back(len(memo))
    memo.clear()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]
