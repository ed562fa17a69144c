"""nvdlfw-inspect's layer selectors (``layers:`` of a section) over the run's module paths.

The keys and their order are nvdlfw-inspect's (``config_manager.is_layer_in_cfg``): ``exact_layer_names``,
else ``layer_name_regex_pattern``, else ``layer_numbers`` and/or ``layer_types`` (both given: both must
match). Layers are named as megatron-core names its modules (``decoder.layers.0.mlp.linear_fc1``, 0-based).
``layer_numbers`` are the numbers nvdlfw-inspect reads from the names Megatron-LM's TE layers carry
(``infer_and_assign_layer_names`` takes megatron-core's ``TransformerLayer.layer_number``, which counts
from 1 over the whole model): TE's layer number N is the module ``decoder.layers.<N-1>``; the output layer
has none. A regular expression is searched in names of a few dozen characters; one that could
backtrack catastrophically (a quantified group holding a quantifier or an alternation, or more than
three unbounded quantifiers) is refused, so matching stays bounded.
"""
from __future__ import annotations

import re
import re._parser as sre_parse  # the standard library's own parse of a pattern, to bound backtracking
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from megatron.quant.capture.inspect_grammar import InspectConfigError, is_int
from megatron.quant.formats.show import show_value

LAYER_KEYS = ("layer_name_regex_pattern", "layer_types", "layer_numbers", "exact_layer_names")
MAX_PATTERN = 1000  # characters of a layer_name_regex_pattern
MAX_UNBOUNDED = 3  # unbounded quantifiers in one pattern: n**3 steps at most on a name of n characters
ALL = "all"
MAX_LAYER_NUMBER = 10_000  # no model has this many layers; a range beyond it would only cost memory
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")
_REPEATS = (sre_parse.MAX_REPEAT, sre_parse.MIN_REPEAT, sre_parse.POSSESSIVE_REPEAT)


@dataclass(frozen=True)
class LayerMatch:
    """A section's selector; None: the key is not given. ``numbers`` ALL: every numbered layer."""

    regex: Optional[str] = None
    types: Optional[tuple[str, ...]] = None
    numbers: Optional[frozenset[int] | str] = None
    exact: Optional[tuple[str, ...]] = None

    def matches(self, layer: str) -> bool:
        if self.exact is not None:
            return layer in self.exact
        if self.regex is not None:
            return re.search(self.regex, layer) is not None
        number = te_layer_number(layer)
        by_number = self.numbers is not None and number is not None and (self.numbers == ALL or number in self.numbers)
        by_type = self.types is not None and any(t in layer or t == ALL for t in self.types)
        if self.numbers is not None and self.types is not None:
            return by_number and by_type
        return by_number or by_type

    def describe(self) -> str:
        numbers = sorted(self.numbers) if isinstance(self.numbers, frozenset) else self.numbers
        if isinstance(numbers, list) and len(numbers) > 8:
            numbers = f"{numbers[:8]} and {len(numbers) - 8} more"
        given = {"exact_layer_names": self.exact, "layer_name_regex_pattern": self.regex, "layer_numbers": numbers,
                 "layer_types": self.types and list(self.types)}
        return ", ".join(f"{key} {value!r}" for key, value in given.items() if value is not None)


def te_layer_number(layer: str) -> Optional[int]:
    """The number nvdlfw-inspect reads from a Megatron-LM TE layer's name: megatron-core's 1-based
    ``layer_number``; None for a module outside the decoder's layers (the output layer)."""
    found = _LAYER.match(layer)
    return None if found is None else int(found.group(1)) + 1


def parse_layers(value: Any, where: str) -> LayerMatch:
    where = f"{where}.layers"
    if not isinstance(value, Mapping) or not value:
        raise InspectConfigError(f"{where}: expected a mapping with one of {', '.join(LAYER_KEYS)}, "
                                 f"got {show_value(value)}")
    unknown = [key for key in value if key not in LAYER_KEYS]
    if unknown:
        raise InspectConfigError(f"{where}: unknown key {show_value(unknown[0])}; allowed: {', '.join(LAYER_KEYS)}")
    regex = value.get("layer_name_regex_pattern")
    if regex is not None:
        _check_regex(regex, f"{where}.layer_name_regex_pattern")
    return LayerMatch(regex=regex, types=_names(value, "layer_types", where),
                      numbers=_numbers(value.get("layer_numbers"), where),
                      exact=_names(value, "exact_layer_names", where))


def _names(value: Mapping, key: str, where: str) -> Optional[tuple[str, ...]]:
    if key not in value:
        return None
    names = value[key]
    if not isinstance(names, list) or not names or not all(isinstance(t, str) and t for t in names):
        raise InspectConfigError(f"{where}.{key}: expected a list of names, got {show_value(names)}")
    return tuple(names)


def _numbers(raw: Any, where: str) -> Optional[frozenset[int] | str]:
    """nvdlfw-inspect's ``_parse_layer_numbers``: an int, "all", or a list of ints and "a-b" ranges."""
    if raw is None:
        return None
    bad = InspectConfigError(f"{where}.layer_numbers: {show_value(raw)} is invalid; allowed: layer numbers from 1 "
                             f"(the first layer) to {MAX_LAYER_NUMBER}, ranges such as \"2-5\", or \"all\"")
    if isinstance(raw, str) and raw.lower() == ALL or isinstance(raw, list) and ALL in raw:
        return ALL
    items = [raw] if is_int(raw) else raw
    if not isinstance(items, list) or not items:
        raise bad
    numbers: set[int] = set()
    for item in items:
        if is_int(item) and 1 <= item <= MAX_LAYER_NUMBER:
            numbers.add(item)
        elif isinstance(item, str) and re.fullmatch(r"\d{1,6}-\d{1,6}", item):
            low, high = map(int, item.split("-"))
            if not 1 <= low <= high <= MAX_LAYER_NUMBER:
                raise bad
            numbers.update(range(low, high + 1))
        else:
            raise bad
    return frozenset(numbers)


def _check_regex(pattern: Any, where: str) -> None:
    if not isinstance(pattern, str) or not pattern or len(pattern) > MAX_PATTERN:
        raise InspectConfigError(f"{where}: {show_value(pattern)} is invalid; allowed: a regular expression of at "
                                 f"most {MAX_PATTERN} characters")
    try:
        parsed = sre_parse.parse(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise InspectConfigError(f"{where}: {show_value(pattern)} is not a regular expression: {exc}") from None
    if _nested(parsed, inside=False):
        raise InspectConfigError(f"{where}: {show_value(pattern)} is refused: a repeated group holds a quantifier or "
                                 f"an alternation, which can backtrack without end; write it without nesting")
    if _unbounded(parsed) > MAX_UNBOUNDED:
        raise InspectConfigError(f"{where}: {show_value(pattern)} is refused: more than {MAX_UNBOUNDED} unbounded "
                                 f"quantifiers (*, +) can backtrack for minutes; use fewer")


def _children(op: Any, av: Any) -> list:
    """The sub-patterns of one parsed item."""
    if op in _REPEATS:
        return [av[2]]
    if op is sre_parse.SUBPATTERN:
        return [av[-1]]
    if op is sre_parse.BRANCH:
        return list(av[1])
    if op in (sre_parse.ASSERT, sre_parse.ASSERT_NOT):
        return [av[1]]
    return []


def _nested(items: Any, inside: bool) -> bool:
    """A quantifier or alternation inside a repeated (max > 1) group."""
    for op, av in items:
        if inside and (op in _REPEATS or op is sre_parse.BRANCH):
            return True
        repeated = op in _REPEATS and av[1] > 1
        if any(_nested(child, inside or repeated) for child in _children(op, av)):
            return True
    return False


def _unbounded(items: Any) -> int:
    return sum((op in _REPEATS and av[1] == sre_parse.MAXREPEAT) + sum(_unbounded(c) for c in _children(op, av))
               for op, av in items)
