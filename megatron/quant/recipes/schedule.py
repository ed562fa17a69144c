"""Recipes that change during a run: a recipe's ``schedule`` of phases, each giving the forward and/or
the backward GEMMs another recipe from an iteration (or a fraction of training) on, and the
``evaluation`` recipe validation forwards run in (as megatron-core's ``evaluation_recipe``).

    schedule:
      - {from: 0.8, forward: bf16}                  # the last 20 % of training: forward GEMMs in BF16
      - {from: 200, until: 300, backward: mxfp8}   # iterations 200-299: backward GEMMs in MXFP8
    evaluation: bf16

``from``/``until`` are iterations as the run numbers them (1 is the first) or fractions of
``--train-iters`` in (0, 1): fraction f is iteration floor(f * train_iters) + 1, so ``from: 0.8`` of 100
iterations starts at 81. ``until`` (exclusive) defaults to the end of training. A phase's recipes are
recipe values (a format, preset or variant name, or a recipe mapping) taking the base recipe's scope
unless they give one; the operands of the other direction keep the base recipe's formats. Outside
every phase the base recipe runs.

The active phase is a pure function of the run position (``megatron.quant.position``): its iteration,
and whether an evaluation runs. A resumed run lands in the phase of its next iteration, and a
recomputed forward sees the position of its first forward, so it takes the same phase.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Optional, Protocol, Sequence

from megatron.quant.formats.show import show_value
from megatron.quant.position import Position
from megatron.quant.recipes.operands import FORWARD_OPERANDS
from megatron.quant.recipes.parse import RecipeError
from megatron.quant.recipes.rules import FormatChoice


class PhaseRecipe(Protocol):
    """What a schedule needs of the recipes it switches to (``recipes.recipe.QuantRecipe``, which reads
    its schedule through this module: the dependency runs one way)."""

    name: str

PHASE_KEYS = ("from", "until", "forward", "backward")
# Each phase is one more configuration of every quantized module, built with the model: a schedule is a
# handful of phases, and a bound keeps a runaway list from costing memory and start time without end.
MAX_PHASES = 100
Point = int | float  # an iteration (int >= 1) or a fraction of training (float in (0, 1))


class ScheduleError(RecipeError):
    """A schedule that cannot run; the message names the value and what is allowed."""


@dataclass(frozen=True)
class Phase:
    """``forward``/``backward`` (None: the base recipe's) from ``start`` until ``until`` (exclusive)."""

    start: Point
    until: Optional[Point] = None
    forward: Optional[PhaseRecipe] = None
    backward: Optional[PhaseRecipe] = None

    def describe(self) -> str:
        parts = [f"{d} {r.name}" for d, r in (("forward", self.forward), ("backward", self.backward)) if r]
        span = f"from {self.start}" + ("" if self.until is None else f" until {self.until}")
        return f"{span}: {', '.join(parts)}"


@dataclass(frozen=True)
class Schedule:
    """A recipe's phases and its evaluation recipe; ``train_iters`` once ``bind`` knows the run's length."""

    phases: tuple[Phase, ...] = ()
    evaluation: Optional[PhaseRecipe] = None
    train_iters: Optional[int] = None

    def __bool__(self) -> bool:
        return bool(self.phases) or self.evaluation is not None

    def recipes(self) -> list[PhaseRecipe]:
        """Every recipe the schedule switches to."""
        found = [r for p in self.phases for r in (p.forward, p.backward) if r is not None]
        return found + ([self.evaluation] if self.evaluation is not None else [])

    def bind(self, train_iters: int, where: str) -> "Schedule":
        """This schedule for a run of ``train_iters`` iterations; ScheduleError (naming ``where``) for a
        switch past the end or phases that overlap."""
        bound = replace(self, train_iters=train_iters)
        spans = bound.spans()
        for i, (phase, (first, end)) in enumerate(zip(self.phases, spans)):
            for key, point, last in (("from", phase.start, train_iters), ("until", phase.until, train_iters + 1)):
                iteration = first if key == "from" else end
                if point is not None and iteration > last:
                    raise ScheduleError(f"{where}: schedule[{i}].{key}: {show_value(point)} is past the end of "
                                        f"training (--train-iters {train_iters}); give an iteration up to {last} or "
                                        f"a fraction below 1")
            if end <= first:
                raise ScheduleError(f"{where}: schedule[{i}].until: {show_value(phase.until)} (iteration {end}) is not "
                                    f"after its from {show_value(phase.start)} (iteration {first})")
            for j in range(i):
                other = spans[j]
                if first < other[1] and other[0] < end:
                    raise ScheduleError(f"{where}: schedule[{i}] (iterations {first}-{end - 1}) overlaps "
                                        f"schedule[{j}] (iterations {other[0]}-{other[1] - 1}); phases must not "
                                        f"overlap")
        return bound

    def spans(self) -> list[tuple[int, int]]:
        """(first iteration, end iteration exclusive) of each phase (``bind`` first)."""
        if self.train_iters is None:
            raise ValueError("a schedule's iterations need the run's length: bind(train_iters) first")
        return [(self._iteration(p.start), self.train_iters + 1 if p.until is None else self._iteration(p.until))
                for p in self.phases]

    def _iteration(self, point: Point) -> int:
        return point if isinstance(point, int) else math.floor(point * self.train_iters) + 1

    def phase_of(self, at: Position) -> int:
        """The phase running at ``at``: 0 the base recipe, i the schedule's (i-1)th phase, and
        ``len(phases) + 1`` an evaluation with its own recipe."""
        if at.evaluating and self.evaluation is not None:
            return len(self.phases) + 1
        for i, (first, end) in enumerate(self.spans()):
            if first <= at.iteration < end:
                return i + 1
        return 0

    def choices(self, base: Mapping[str, FormatChoice], choices_of: Callable[[PhaseRecipe], Mapping]
                ) -> list[dict[str, FormatChoice]]:
        """A module's operand choices per phase index (``phase_of``): ``base`` (the base recipe's),
        each phase's (its recipes' choices for their direction's operands), the evaluation recipe's."""
        per_phase = [dict(base)]
        for phase in self.phases:
            chosen = dict(base)
            for recipe, forward in ((phase.forward, True), (phase.backward, False)):
                if recipe is not None:
                    theirs = choices_of(recipe)
                    chosen.update({k: v for k, v in theirs.items() if (k in FORWARD_OPERANDS) == forward})
            per_phase.append(chosen)
        if self.evaluation is not None:
            per_phase.append(dict(choices_of(self.evaluation)))
        return per_phase

    def phase_names(self) -> list[str]:
        """The name of each phase index (``phase_of``) in messages: the base recipe, schedule[i], evaluation."""
        return (["the base recipe"] + [f"schedule[{i}]" for i in range(len(self.phases))]
                + (["evaluation"] if self.evaluation is not None else []))

    def describe(self) -> str:
        """One line for the start line and run.json, e.g. 'from 0.8: forward bf16; evaluation bf16'."""
        parts = [phase.describe() for phase in self.phases]
        if self.train_iters is not None:
            parts = [f"{text} (iterations {first}-{end - 1})" for text, (first, end) in zip(parts, self.spans())]
        if self.evaluation is not None:
            parts.append(f"evaluation {self.evaluation.name}")
        return "; ".join(parts)


def parse_schedule(schedule: Any, evaluation: Any, source: str,
                   build: Callable[[Any, str], PhaseRecipe]) -> Schedule:
    """The ``schedule`` list and ``evaluation`` value of a recipe; ``build(value, path)`` parses a phase's
    recipe value (inheriting the base's scope). ScheduleError names the bad value."""
    if schedule is None:
        schedule = []
    if not isinstance(schedule, list):
        raise ScheduleError(f"{source}: schedule: expected a list of phases, got {show_value(schedule)}")
    if len(schedule) > MAX_PHASES:
        raise ScheduleError(f"{source}: schedule: {len(schedule)} phases; at most {MAX_PHASES} (each phase configures "
                            f"every quantized module once more)")
    phases = tuple(_parse_phase(item, f"schedule[{i}]", source, build) for i, item in enumerate(schedule))
    return Schedule(phases, None if evaluation is None else build(evaluation, "evaluation"))


def _parse_phase(value: Any, path: str, source: str, build: Callable[[Any, str], PhaseRecipe]) -> Phase:
    if not isinstance(value, Mapping):
        raise ScheduleError(f"{source}: {path}: expected a mapping with {', '.join(PHASE_KEYS)}, got "
                            f"{show_value(value)}")
    unknown = [key for key in value if key not in PHASE_KEYS]
    if unknown:
        raise ScheduleError(f"{source}: {path}: unknown key {show_value(unknown[0])}; allowed: {', '.join(PHASE_KEYS)}")
    if "from" not in value:
        raise ScheduleError(f"{source}: {path}: a phase needs 'from' (an iteration, or a fraction of training)")
    start = _point(value["from"], f"{path}.from", source)
    until = None if value.get("until") is None else _point(value["until"], f"{path}.until", source)
    if until is not None and type(until) is type(start) and until <= start:
        raise ScheduleError(f"{source}: {path}.until: {show_value(until)} is not after from {show_value(start)}")
    recipes = {d: build(value[d], f"{path}.{d}") for d in ("forward", "backward") if value.get(d) is not None}
    if not recipes:
        raise ScheduleError(f"{source}: {path}: a phase needs 'forward' and/or 'backward' (a recipe for those GEMMs)")
    return Phase(start, until, recipes.get("forward"), recipes.get("backward"))


def _point(value: Any, path: str, source: str) -> Point:
    """An iteration (int >= 1) or a fraction of training (float in (0, 1))."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ScheduleError(f"{source}: {path}: {show_value(value)} is neither an iteration nor a fraction")
    if isinstance(value, int) and value >= 1:
        return value
    if isinstance(value, float) and 0.0 < value < 1.0:
        return value
    raise ScheduleError(f"{source}: {path}: {show_value(value)} must be an iteration >= 1 or a fraction of "
                        f"training in (0, 1) (1.0 and beyond: past the end)")


def phase_recipe_value(value: Any, scope: Sequence[str]) -> Mapping[str, Any]:
    """A phase's recipe value as a recipe mapping that takes the base recipe's ``scope`` unless it gives one."""
    data = {"format": value, "name": value} if isinstance(value, str) else dict(value) if isinstance(value, Mapping) \
        else value
    if isinstance(data, Mapping) and "scope" not in data:
        data = {**data, "scope": list(scope)}
    return data
