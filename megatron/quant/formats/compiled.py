"""A round-to-nearest format whose quantization runs under ``torch.compile``."""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor


class CompiledFormat:
    """A NumericFormat whose ``quantize`` runs under ``torch.compile`` (static shapes).

    Same results as the eager format (the formats are written to compile to the same bit
    operations); several times faster on CPU after a one-off compilation per tensor shape and
    axis. Share one instance per format across a model so that those compilations are shared.
    """

    # A Llama layer quantizes ~20 distinct (shape, axis) combinations per format.
    RECOMPILE_LIMIT = 64

    def __init__(self, fmt: Any) -> None:
        if fmt.rounding == "stochastic":
            raise ValueError(f"{fmt.name}: compiled quantization is for round-to-nearest formats; stochastic "
                             f"rounding keys its noise per call, which would recompile every call")
        self.fmt = fmt
        self._quantize = torch.compile(fmt.quantize, dynamic=False)
        self._for_gemm = torch.compile(fmt.quantize_for_gemm, dynamic=False)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fmt, name)

    def quantize(self, x: Tensor, axis: int = -1, amax: Optional[Tensor] = None, **_: Any) -> Tensor:
        with torch._dynamo.config.patch(recompile_limit=self.RECOMPILE_LIMIT):
            return self._quantize(x, axis=axis, amax=amax)

    def quantize_for_gemm(self, x: Tensor, axis: int = -1, amax: Optional[Tensor] = None, **_: Any
                          ) -> tuple[Tensor, Optional[Tensor]]:
        with torch._dynamo.config.patch(recompile_limit=self.RECOMPILE_LIMIT):
            return self._for_gemm(x, axis=axis, amax=amax)
