"""Every Triton kernel of this package, in one table: the benchmarks, the sm_90 build
(``bench.gpu.kernel_build``), the profiler's buckets (``bench.gpu.profile_buckets``) and the tests read
it. Importing it imports no Triton; ``Kernel.module`` imports the kernel's module when asked."""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Literal

KernelRole = Literal["quantize", "amax", "gemm"]
"""What a kernel does: quantizes (and may take statistics), only reduces a tensor's amax, or multiplies
two operands as a tensor core adds their products (``accumulate``)."""


@dataclass(frozen=True)
class Kernel:
    """One ``@triton.jit`` kernel: its module under ``megatron.quant.kernels`` and its name there."""

    module_name: str
    name: str
    role: KernelRole

    def module(self) -> ModuleType:
        """The kernel's module (imports Triton)."""
        return importlib.import_module(f"{__package__}.{self.module_name}")


KERNELS = (
    Kernel("elementwise", "_elementwise_kernel", "quantize"),
    Kernel("blocks", "_block_kernel", "quantize"),
    Kernel("blocks", "_dual_kernel", "quantize"),
    Kernel("amax", "_amax_kernel", "amax"),
    Kernel("amax", "_fold_kernel", "amax"),
    Kernel("history", "_history_kernel", "amax"),
    Kernel("accumulate", "_hopper_kernel", "gemm"),
)
NAMES = frozenset(kernel.name for kernel in KERNELS)
