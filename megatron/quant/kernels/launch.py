"""How every Triton kernel launches: exact arithmetic, elements per program, the CPU interpreter.

The bottom of ``kernels``: the kernel modules (elementwise, blocks, amax) and the choice of
path (``select``) read these rules; nothing here imports Triton.
"""
from __future__ import annotations

import os


def interpreting() -> bool:
    """True when Triton kernels run in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "yes", "on")


# Launch options of every kernel: no multiply-add contraction into FMAs (Triton's default), which
# would round once where the torch path rounds twice.
EXACT_ARITHMETIC = {"enable_fp_fusion": False}


def program_elements(on_device: int) -> int:
    """Elements per kernel program: ``on_device`` on a GPU; many more in the interpreter, which runs
    programs one after another in Python (the results do not depend on it: blocks never straddle)."""
    return 1 << 15 if interpreting() else on_device
