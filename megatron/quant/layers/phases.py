"""A quantized module whose recipe changes during the run (``recipes.schedule``): one set of its
quantization attributes per phase, built at ``finish_init`` by configuring the module once per phase,
and the set of the phase running now swapped in when a forward starts.

The phase is a pure function of the run position (``position.current()``): the loop's iteration, or
inside a recomputed forward the position of its first forward (so the recompute takes the same
phase), and whether an evaluation runs. A backward uses what its forward captured, so one iteration
never mixes phases.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

from megatron.quant import position
from megatron.quant.formats.interface import QuantFormat

Formats = Mapping[str, Optional[QuantFormat]]


class Phased:
    """The phase switching of a quantized module; ``PHASED`` names the attributes its
    ``configure_quant`` sets (the operand specs, caches and noise stream)."""

    PHASED: tuple[str, ...] = ()
    phase_states: tuple[dict[str, Any], ...] = ()
    phase_of: Optional[Callable[[position.Position], int]] = None
    phase: int = 0

    def configure_phases(self, configure: Callable[[Formats], None], phases: Sequence[Formats],
                         phase_of: Optional[Callable[[position.Position], int]]) -> None:
        """``configure`` the module for each phase's formats and keep each phase's attributes; the
        module starts in phase 0 (the base recipe). (A scheduled recipe has no delayed scaling, whose
        amax histories the module registers once: ``PrecisionConfig.for_run`` refuses it.)"""
        states = []
        for formats in phases:
            configure(formats)
            states.append({name: getattr(self, name) for name in self.PHASED})
        self.phase_states, self.phase_of = (tuple(states), phase_of) if len(states) > 1 else ((), None)
        self._take(0)

    def enter_phase(self) -> None:
        """Swap in the attributes of the phase running at the current position (a forward's start)."""
        if self.phase_of is not None:
            index = self.phase_of(position.current())
            if index != self.phase:
                self._take(index)

    def _take(self, index: int) -> None:
        for name, value in (self.phase_states[index].items() if self.phase_states else ()):
            setattr(self, name, value)
        self.phase = index
