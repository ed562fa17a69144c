"""A round-to-nearest format whose quantization runs under ``torch.compile``."""
from __future__ import annotations

import types
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from .base import NumericFormat
from .interface import along_both_axes
from .quantization import VALUE, Quantization, Want
from .random_bits import RandomBits
from .rounding import is_stochastic
from .wrapper import FormatWrapper


def _own_code(method: Callable, label: str) -> Callable:
    """``method`` (bound) with a code object of its own.

    Dynamo keeps its compiled variants, and counts them against its recompile limit, per code
    object: every format's ``quantize`` shares ``QuantFormat.quantize``'s, so a process that
    compiled a few formats at a few shapes each used to hit the limit and run the rest eager
    without a word. A copy of the code per format gives each format its own limit.
    """
    func = method.__func__
    code = func.__code__.replace(co_name=f"{func.__name__}_{label}")
    clone = types.FunctionType(code, func.__globals__, code.co_name, func.__defaults__, func.__closure__)
    clone.__kwdefaults__ = func.__kwdefaults__
    return types.MethodType(clone, method.__self__)


class CompiledFormat(FormatWrapper):
    """A NumericFormat whose value and GEMM operand (``run`` with ``VALUE`` or ``GEMM``, what ``quantize``
    and ``quantize_for_gemm`` ask for) run under ``torch.compile`` (static shapes); the other requests
    (scale, statistics) run eager, and its other members are the format's (``FormatWrapper``).

    Same results as the eager format (the formats are written to compile to the same bit
    operations); several times faster on CPU after a one-off compilation per tensor shape and
    axis. Share one instance per format across a model so that those compilations are shared.
    Each instance compiles code objects of its own (``_own_code``), and a call past the
    recompile limit raises instead of silently running eager.
    """

    fmt: NumericFormat  # whose methods are compiled
    # A Llama layer quantizes ~20 distinct (shape, axis) combinations per format.
    RECOMPILE_LIMIT = 64
    BACKEND = "inductor"

    def __init__(self, fmt: NumericFormat) -> None:
        if is_stochastic(fmt.rounding):
            raise ValueError(f"{fmt.name}: compiled quantization is for round-to-nearest formats; stochastic "
                             f"rounding keys its noise per call, which would recompile every call")
        super().__init__(fmt)
        label = f"{fmt.name}_{id(self):x}"
        self._quantize = torch.compile(_own_code(fmt.quantize, label), dynamic=False, backend=self.BACKEND)
        self._for_gemm = torch.compile(_own_code(fmt.quantize_for_gemm, label), dynamic=False, backend=self.BACKEND)

    def _run(self, compiled: Callable, x: Tensor, axis: int, amax: Optional[Tensor]) -> Any:
        try:
            with torch._dynamo.config.patch(recompile_limit=self.RECOMPILE_LIMIT, fail_on_recompile_limit_hit=True):
                return compiled(x, axis=axis, amax=amax)
        except torch._dynamo.exc.FailOnRecompileLimitHit:
            raise RuntimeError(f"{self.fmt.name}: torch.compile reached its limit of {self.RECOMPILE_LIMIT} "
                               f"compilations (tensor shapes x axes) and would run eager from here; raise "
                               f"CompiledFormat.RECOMPILE_LIMIT or set CUSTOM_QUANT_KERNELS=torch") from None

    # Round-to-nearest only (checked at construction): ``noise`` and ``generator`` change nothing.
    def run(self, x: Tensor, axis: int = -1, amax: Optional[Tensor] = None, *, want: Want = VALUE,
            noise: Optional[RandomBits] = None, generator: Optional[torch.Generator] = None,
            cross_noise: Optional[RandomBits] = None) -> Quantization:
        if want.both_axes:
            return along_both_axes(self, x, axis, amax, noise, generator, cross_noise)
        if want.gemm:
            operand, tensor_scale = self._run(self._for_gemm, x, axis, amax)
            own = self.amax_of(x.detach(), axis) if want.amax else None
            return Quantization(operand=operand, tensor_scale=tensor_scale, amax=own)
        if want == VALUE:
            return Quantization(self._run(self._quantize, x, axis, amax))
        return self.fmt.run(x, axis, amax, want=want, noise=noise, generator=generator)
