"""Which captures an analysis looks at: quant types, layers, roles, tensor names, iterations, ranks."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Iterable, Optional

from megatron.quant.analysis.captures.catalog import CaptureRecord
from megatron.quant.settings.selectors import IndexSet


class FilterError(ValueError):
    """A filter value matches no capture; the message lists the values that exist."""


@dataclass(frozen=True)
class CaptureFilter:
    """None means "any"; otherwise a capture must have one of the given values. The integer
    filters are IndexSets (a range is never listed); sets of ints given are converted."""
    quant_types: Optional[frozenset[str]] = None
    layers: Optional[IndexSet] = None
    roles: Optional[frozenset[str]] = None
    tensor_names: Optional[frozenset[str]] = None
    iterations: Optional[IndexSet] = None
    ranks: Optional[IndexSet] = None

    def __post_init__(self) -> None:
        for name in ("layers", "iterations", "ranks"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, IndexSet):
                object.__setattr__(self, name, IndexSet.from_values(value))

    def matches(self, record: CaptureRecord, unknown_role_passes: bool = False) -> bool:
        """``unknown_role_passes``: keep records whose role is only known after loading the file."""
        for name, allowed in self._active():
            value = _value(record, name)
            if value is None and name == "roles" and unknown_role_passes:
                continue
            if value not in allowed:
                return False
        return True

    def validate(self, records: Iterable[CaptureRecord]) -> None:
        """Raise FilterError for a value no capture has (a typo would otherwise select nothing)."""
        records = list(records)
        for name, allowed in self._active():
            present = {_value(r, name) for r in records} - {None}
            if name == "roles" and not present:
                continue  # file-name-only captures: roles are checked after loading
            unknown = (allowed.difference(present) if isinstance(allowed, IndexSet)
                       else frozenset(allowed - present))
            if unknown:
                count = unknown.count() if isinstance(unknown, IndexSet) else len(unknown)
                raise FilterError(
                    f"--{name} {_describe(unknown)}: no capture has "
                    f"{'this value' if count == 1 else 'these values'}; available: "
                    f"{_describe(present) or 'none'}")

    def describe(self) -> str:
        parts = [f"{name}={_describe(allowed).replace(', ', ',')}" for name, allowed in self._active()]
        return "; ".join(parts) if parts else "none (all captures)"

    def _active(self) -> list[tuple[str, frozenset]]:
        return [(f.name, getattr(self, f.name)) for f in fields(self)
                if getattr(self, f.name) is not None]


_RECORD_FIELD = {"quant_types": "quant_type", "layers": "layer_idx", "roles": "role",
                 "tensor_names": "tensor_name", "iterations": "iteration", "ranks": "rank"}


def _describe(values) -> str:
    """'0-3,7' for integers (ranges stay ranges), 'a,b' for names."""
    if isinstance(values, IndexSet):
        return str(values)
    if values and all(isinstance(v, int) for v in values):
        return str(IndexSet.from_values(values))
    return ", ".join(map(str, sorted(values, key=str)))


def _value(record: CaptureRecord, filter_name: str):
    return getattr(record, _RECORD_FIELD[filter_name])


def select(records: Iterable[CaptureRecord], capture_filter: CaptureFilter,
           unknown_role_passes: bool = False) -> list[CaptureRecord]:
    return [r for r in records if capture_filter.matches(r, unknown_role_passes)]
