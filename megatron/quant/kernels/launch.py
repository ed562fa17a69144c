"""How every Triton kernel launches: exact arithmetic, elements per program, the CPU interpreter.

The bottom of ``kernels``: the kernel modules (elementwise, blocks, amax) and the choice of
path (``select``) read these rules; nothing here imports Triton.
"""
from __future__ import annotations

from megatron.quant.settings.environment import triton_interpreting


def interpreting() -> bool:
    """True when Triton kernels run in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return triton_interpreting()  # read at each launch: tests set it per test


# Launch options of every kernel: no multiply-add contraction into FMAs (Triton's default), which
# would round once where the torch path rounds twice.
EXACT_ARITHMETIC = {"enable_fp_fusion": False}


def launch_options(elements: int, stats: int = 0) -> dict:
    """Every launch's options for programs of ``elements`` values: exact arithmetic, and warps enough
    that a thread holds at most about 32 of them (Triton's own rule of thumb: 4 warps up to 2048, 8
    up to 8192, then 16). With 4 warps a 128 x 128 FP8 tile spilled 4-9 KB a thread to local memory
    (Triton 3.6, sm_90; ``python -m bench.gpu.kernel_build --cubin``). The warps change no bits:
    every reduction in the kernels is a max, a min, an integer count or a sum in a fixed order.
    With statistics (``stats`` nonzero: ``kernels.stats``' level) a program of up to 2048 values takes
    16 a thread (2 warps for 1024) instead of 8, halving each thread's share of the statistics'
    reductions across lanes and warps (Triton 3.9, MXFP8 blocks of bf16 with full statistics: 440 ->
    304 instructions an element, 190 registers, no stack; 32 a thread spilled about 1 KB)."""
    if stats and elements <= 2048:
        return {**EXACT_ARITHMETIC, "num_warps": max(1, elements // 512)}
    return {**EXACT_ARITHMETIC, "num_warps": 4 if elements <= 2048 else 8 if elements <= 8192 else 16}


def program_elements(on_device: int) -> int:
    """Elements per kernel program: ``on_device`` on a GPU; many more in the interpreter, which runs
    programs one after another in Python (the results do not depend on it: blocks never straddle)."""
    return 1 << 15 if interpreting() else on_device
