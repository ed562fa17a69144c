"""Typed reading of a study plan's mapping: every failure is a ``StudyPlanError`` of one line that
names the file and the key."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence


class StudyPlanError(ValueError):
    """A plan that cannot run; the message names the file, the key and what is allowed."""


class PlanReader:
    """Typed access to the plan's mapping; every failure names the file and the key."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, key: str, message: str) -> StudyPlanError:
        return StudyPlanError(f"{self.path}: {key}: {message}")

    def mapping(self, value: Any, key: str, allowed: Sequence[str] | None = None) -> dict:
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a mapping, got {value!r}")
        unknown = sorted(set(map(str, value)) - set(allowed)) if allowed is not None else []
        if unknown:
            raise self.fail(key, f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}")
        return value

    def integer(self, value: Any, key: str, minimum: int = 1) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(key, f"expected an integer >= {minimum}, got {value!r}")
        return value

    def number(self, value: Any, key: str, low: float = 0.0, high: float = float("inf")) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low < value < high:
            raise self.fail(key, f"expected a number in ({low:g}, {high:g}), got {value!r}")
        return float(value)

    def names(self, value: Any, key: str) -> list[str]:
        if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
            raise self.fail(key, f"expected a non-empty list of names, got {value!r}")
        duplicates = sorted({v for v in value if value.count(v) > 1})
        if duplicates:
            raise self.fail(key, f"{', '.join(duplicates)} given twice")
        return value
