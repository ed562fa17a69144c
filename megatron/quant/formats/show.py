"""Bounded excerpts of user values for error messages, so a 100,000-character variable or a deeply
nested YAML value is named in one short line. The lowest room that reports bad input uses it; the
rooms above (kernels, recipes, training) import it from here."""
from __future__ import annotations

import reprlib
from typing import Any

_SHOWN = reprlib.Repr()
_SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlevel, _SHOWN.maxlist = 80, 80, 3, 8


def show_value(value: Any, limit: int = 120) -> str:
    """A bounded excerpt of ``value`` (its repr, at most ``limit`` characters), however large or nested it is."""
    text = _SHOWN.repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
