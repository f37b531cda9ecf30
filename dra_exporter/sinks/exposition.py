"""The exposition formats, written directly from a ``model.Frame``: Prometheus text 0.0.4 and OpenMetrics 1.0.

Contract: ``render(frame)`` and ``render(frame, openmetrics=True)`` return exactly the bytes
prometheus_client's ``generate_latest`` (text) and ``openmetrics.exposition.generate_latest``
return for the same families, built as gauge and counter families with the catalogue's help
and type and no ``_created`` series; ``tests/test_benchmarks.py`` checks that equivalence on
arbitrary frames and ``tests/golden/demo.prom`` pins the bytes. In particular:

- label pairs are written sorted by name; values escape backslash, double quote and newline
  and are otherwise any UTF-8;
- numbers are written as that library writes them: ``NaN``, ``+Inf``, ``-Inf``, Python's
  shortest round-trip form (``1.0``, ``0.25``), and positive values from 1e6 up in exponent
  form (``1.23456789e+09``);
- counters: text ``# TYPE <name>_total counter``, OpenMetrics ``# TYPE <name> counter``, the
  samples ``<name>_total`` in both; OpenMetrics ends with ``# EOF``;
- a family with no samples is left out; one the catalogue does not declare is an
  ``UnknownMetricError``.

Why not build prometheus_client families every cycle: that costs ~10 us per sample and
formats every label set once per family (a device's identity and attribution labels repeat
in ~30 families). Here the HELP/TYPE lines are built once per family name, each label set is
formatted once and cached across cycles (label sets change only when pods or devices do),
values are cached too (a frame has few distinct ones), both caches are bounded by the frame,
and the two formats share the sample lines, so rendering a frame in both formats costs
about a tenth of what it did (figures in docs/performance.md).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Final

from .. import catalog, model, printable

_COUNTER_SUFFIX: Final = "_total"
_EOF: Final = "# EOF\n"
#: repr() of the floats that are not written as numbers.
_SPECIAL: Final = {"inf": "+Inf", "-inf": "-Inf", "nan": "NaN"}
#: Characters a legacy label name may not contain; prometheus_client writes them as "_".
_BAD_LABEL_CHAR: Final = re.compile(r"[^a-zA-Z0-9_]")


class UnknownMetricError(ValueError):
    """A frame holds a family that is not in ``dra_exporter.catalog``."""


def format_value(value: float) -> str:
    """A sample value as prometheus_client writes it (see the module docstring)."""
    text = repr(float(value))
    if "." not in text:
        return _SPECIAL.get(text, text)  # inf, nan, or already an exponent (1e+16, 1e-05)
    if 1e6 <= value < 1e16:
        # Seven or more integer digits: move the point behind the first digit.
        whole, _, fraction = text.partition(".")
        digits = (whole + fraction).rstrip("0")
        mantissa = f"{digits[0]}.{digits[1:]}" if len(digits) > 1 else digits
        return f"{mantissa}e+{len(whole) - 1:02d}"
    return text


def _utf8(text: str) -> bytes:
    # A lone surrogate (JSON's "\ud800", from any API object) cannot be UTF-8: it becomes "?"
    # instead of failing every scrape.
    return text.encode("utf-8", errors="replace")


def valid_text(value: str) -> str:
    """``value`` with what UTF-8 cannot carry (lone surrogates) replaced by ``?``."""
    return value if value.isascii() else _utf8(value).decode("utf-8")


def escape_label_value(value: str) -> str:
    """``value`` inside a label's quotes: escaped, control characters replaced (``printable``)."""
    return printable.exposition_label_value(value)


def _label_name(name: str) -> str:
    safe = _BAD_LABEL_CHAR.sub("_", name)
    return "_" + safe[1:] if safe[:1].isdigit() else safe


@dataclass(frozen=True, slots=True)
class _Head:
    """What a family writes once, whatever its samples: HELP/TYPE lines and the sample name."""

    text: str
    openmetrics: str
    sample_name: str


def _head(name: str) -> _Head:
    try:
        spec = catalog.spec(name)
    except KeyError:
        raise UnknownMetricError(
            f"metric family {name!r} is not declared in dra_exporter.catalog") from None
    help_text = spec.help.replace("\\", "\\\\").replace("\n", "\\n")
    help_om = help_text.replace('"', '\\"')
    if spec.kind == "counter":
        base = spec.name.removesuffix(_COUNTER_SUFFIX)
        sample = base + _COUNTER_SUFFIX
        return _Head(f"# HELP {sample} {help_text}\n# TYPE {sample} counter\n",
                     f"# HELP {base} {help_om}\n# TYPE {base} counter\n", sample)
    return _Head(f"# HELP {spec.name} {help_text}\n# TYPE {spec.name} gauge\n",
                 f"# HELP {spec.name} {help_om}\n# TYPE {spec.name} gauge\n", spec.name)


@dataclass(frozen=True, slots=True)
class _Rendered:
    """The formats' common part for one frame: each family's head and sample lines."""

    frame: model.Frame
    families: tuple[tuple[_Head, str], ...]

    def text(self) -> bytes:
        return _utf8("".join([part for head, body in self.families for part in (head.text, body)]))

    def openmetrics(self) -> bytes:
        parts = [part for head, body in self.families for part in (head.openmetrics, body)]
        parts.append(_EOF)
        return _utf8("".join(parts))


class Renderer:
    """Renders frames in both formats, reusing what repeats between cycles.

    Safe to share between threads: the caches are dicts filled idempotently (two threads
    that miss together write the same string), and the label cache and the last frame's
    result are replaced with one assignment each.
    """

    def __init__(self) -> None:
        self._heads: dict[str, _Head] = {}
        self._labels: dict[model.Labels, str] = {}
        self._values: dict[float, str] = {}
        self._label_names: dict[str, str] = {}
        self._last: _Rendered | None = None

    def render(self, frame: model.Frame, *, openmetrics: bool = False) -> bytes:
        rendered = self._rendered(frame)
        return rendered.openmetrics() if openmetrics else rendered.text()

    def render_both(self, frame: model.Frame) -> tuple[bytes, bytes]:
        """``(text, openmetrics)``: the sample lines are formatted once for both."""
        rendered = self._rendered(frame)
        return rendered.text(), rendered.openmetrics()

    def _rendered(self, frame: model.Frame) -> _Rendered:
        last = self._last
        if last is not None and last.frame is frame:
            return last  # the sink renders each frame twice, text then OpenMetrics
        families = []
        samples = 0
        for family in frame.families:
            if family.samples:
                families.append((self._family_head(family.name), self._lines(family)))
                samples += len(family.samples)
        self._trim_caches(frame, samples)
        rendered = _Rendered(frame, tuple(families))
        self._last = rendered
        return rendered

    def _family_head(self, name: str) -> _Head:
        head = self._heads.get(name)
        if head is None:
            head = self._heads[name] = _head(name)
        return head

    def _lines(self, family: model.Family) -> str:
        name = self._family_head(family.name).sample_name
        labels, new_labels = self._labels.get, self._label_string
        values, new_value = self._values.get, self._value_string
        # The hot loop: two dict lookups per sample. A frame has few distinct values (0, 1,
        # memory sizes, clocks: ~300 in 1,500 samples at `scale`), so values are cached too.
        return "".join([
            f"{name}{labels(s.labels) or new_labels(s.labels)} {values(s.value) or new_value(s.value)}\n"
            for s in family.samples
        ])

    def _label_string(self, labels: model.Labels) -> str:
        if not labels:
            return ""
        names = self._label_names
        pairs = []
        for key, value in sorted(dict(labels).items()):
            name = names.get(key)
            if name is None:
                name = names[key] = _label_name(key)
            pairs.append(f'{name}="{escape_label_value(value)}"')
        text = "{" + ",".join(pairs) + "}"
        self._labels[labels] = text
        return text

    def _value_string(self, value: float) -> str:
        if value == 0:
            # 0.0 and -0.0 are equal dict keys but written differently: zeros stay uncached.
            return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
        text = self._values[value] = format_value(value)
        return text

    def _trim_caches(self, frame: model.Frame, samples: int) -> None:
        # Under churn the caches collect the label sets of departed pods, and every cycle
        # brings new values. Once a cache holds more entries than the frame has samples, it
        # keeps only what this frame used: bounded by the frame, and the next render stays warm.
        if len(self._labels) > samples:
            labels = self._labels
            self._labels = {s.labels: text for f in frame.families for s in f.samples
                            if (text := labels.get(s.labels)) is not None}
        if len(self._values) > samples:
            values = self._values
            self._values = {s.value: text for f in frame.families for s in f.samples
                            if (text := values.get(s.value)) is not None}


_DEFAULT: Final = Renderer()


def render(frame: model.Frame, *, openmetrics: bool = False) -> bytes:
    """The exposition of ``frame``: Prometheus text 0.0.4, or OpenMetrics 1.0 (with ``# EOF``)."""
    return _DEFAULT.render(frame, openmetrics=openmetrics)


def render_both(frame: model.Frame) -> tuple[bytes, bytes]:
    """``(text, openmetrics)`` of ``frame``, formatting its samples once."""
    return _DEFAULT.render_both(frame)
