"""Strings from peers (an API object, a Prometheus series, the kubelet, NVML) made safe for where they go.

One definition of which characters a peer may not put into our output, and three ways out:

- ``exposition_label_value``: a label value of the Prometheus text and OpenMetrics pages. The formats
  escape only backslash, double quote and line feed; any other control character is legal inside the
  quotes, yet a reader that splits lines on CR (a text stream with universal newlines, as Python opens
  an HTTP body or a file) or on NEL/U+2028 (``str.splitlines``) cuts the sample in two and refuses the
  whole page. So every control character (C0, DEL, C1) and the two Unicode line separators become
  U+FFFD, the replacement character: no escape exists for them in either format (``\\r`` is an invalid
  escape to Prometheus), and a literal escape like ``\\x0d`` would be read back as four characters.
- ``for_terminal``: a cell of a table or a line of text printed for a person. Controls (ESC starts
  the sequences that clear the screen or set the window title; CR and LF forge rows), format
  characters (U+202E reverses the text after it; zero-width characters hide it) and line separators
  are written as visible escapes (``\\x1b``, ``\\u202e``): the value stays recognisable, never obeyed.
- ``csv_cell``: ``for_terminal``, and a cell that a spreadsheet would run as a formula (it starts
  with ``=``, ``+``, ``-``, ``@``, a tab or a CR) gets a leading ``'`` (OWASP's advice).

Pure: no I/O.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Final

#: Controls (C0 without LF, DEL, C1) and the line and paragraph separators: what a line-based reader
#: of an exposition may take for the end of a line or of a string. LF is the formats' own escape.
_EXPOSITION_UNSAFE: Final = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")
REPLACEMENT: Final = "\ufffd"

#: Categories a terminal may act on, or that hide or reorder what is shown: controls, format
#: characters (bidi overrides and isolates, zero-width, the BOM), line and paragraph separators,
#: surrogates (not text at all), unassigned code points (a future terminal may give them a meaning).
_TERMINAL_UNSAFE_CATEGORIES: Final = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Cn"})
#: Cells a spreadsheet would evaluate (CSV injection).
_FORMULA_STARTS: Final = ("=", "+", "-", "@", "\t", "\r")


def without_controls(value: str) -> str:
    """``value`` as an exposition carries it: controls but LF, and line separators, replaced (module doc)."""
    return _EXPOSITION_UNSAFE.sub(REPLACEMENT, value) if _EXPOSITION_UNSAFE.search(value) else value


def exposition_label_value(value: str) -> str:
    """``value`` inside the quotes of a label of either exposition format: ``without_controls``, escaped."""
    return without_controls(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def for_terminal(text: str) -> str:
    """``text`` with every character a terminal could obey written as a visible escape (module doc)."""
    if text.isascii() and text.isprintable():
        return text  # the common case, and fast
    return "".join(_escape(c) if unicodedata.category(c) in _TERMINAL_UNSAFE_CATEGORIES else c for c in text)


def csv_cell(text: str) -> str:
    """``text`` for a CSV cell that a person opens in a spreadsheet: ``for_terminal``, never a formula."""
    shown = for_terminal(text)
    return "'" + shown if text.startswith(_FORMULA_STARTS) else shown
