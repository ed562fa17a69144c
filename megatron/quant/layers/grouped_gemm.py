"""The experts' GEMMs over token groups: each expert's product in one launch where torch has a grouped GEMM.

``grouped_product`` runs one GEMM per expert (``grouped_operand.TokenGroups``: the tokens sorted by expert)
as torch's grouped matrix product (``torch._grouped_mm``: one launch) where the installed torch runs it for
the operands' dtype and device and their strides are 16-byte aligned, else one ``scaled_gemm.matmul`` per
expert; on the CPU both give the per-expert products bit for bit (``tests/layers/test_grouped_experts.py``).
CUDA's grouped GEMM writes its operands' dtype only, so a GEMM summed into FP32 runs per expert there.
"""
from __future__ import annotations

import functools
from typing import Literal, Optional

import torch
from torch import Tensor

from megatron.quant.layers.grouped_operand import TokenGroups
from megatron.quant.layers.scaled_gemm import matmul

Gemm = Literal["fprop", "dgrad", "wgrad"]


@functools.cache
def grouped_mm_runs(device_type: str, dtype: torch.dtype) -> bool:
    """Whether the installed torch runs its grouped GEMM for ``dtype`` on ``device_type`` in the three layouts
    ``grouped_product`` uses, with token groups of any size and an empty one, and gets each group's product
    (CUDA's takes bf16 only, on recent GPUs; the CPU's bf16 and fp32 in recent releases)."""
    try:
        ends = torch.tensor([3, 3, 16], dtype=torch.int32, device=device_type)
        tokens = torch.ones(16, 8, dtype=dtype, device=device_type)
        weights = torch.ones(3, 8, 8, dtype=dtype, device=device_type)
        fprop = torch._grouped_mm(tokens, weights.transpose(1, 2), offs=ends)
        dgrad = torch._grouped_mm(tokens, weights, offs=ends)
        wgrad = torch._grouped_mm(tokens.t(), tokens, offs=ends)
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
    counts = torch.tensor([3.0, 0.0, 13.0], dtype=dtype, device=device_type).reshape(3, 1, 1).expand(3, 8, 8)
    return bool((fprop == 8).all() and (dgrad == 8).all() and torch.equal(wgrad, counts))


def _aligned(*sizes: int, dtype: torch.dtype) -> bool:
    per_16_bytes = 16 // torch.empty((), dtype=dtype).element_size()
    return all(size % per_16_bytes == 0 for size in sizes)


def grouped_product(gemm: Gemm, a: Tensor, b: Tensor, groups: TokenGroups,
                    out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """Each expert's product, in its operands' dtype or summed into ``out_dtype`` as ``scaled_gemm.matmul``:

    - ``fprop``: tokens a [T, k] by stacked weights b [E, n, k], a_e @ b_e^T -> [T, n];
    - ``dgrad``: gradients a [T, n] by stacked weights b [E, n, k], a_e @ b_e -> [T, k];
    - ``wgrad``: gradients a [T, n] by inputs b [T, k], a_e^T @ b_e -> [E, n, k].
    """
    if gemm == "fprop":
        left, right = a, b.transpose(1, 2)
    elif gemm == "dgrad":
        left, right = a, b
    else:
        left, right = a.t(), b
    dtype = out_dtype or a.dtype
    # The CPU widens narrow operands for an FP32 sum itself (scaled_gemm.matmul does the same); CUDA's
    # grouped GEMM writes its operands' dtype only.
    widen = dtype != a.dtype and a.device.type == "cpu"
    run = dtype if widen else a.dtype
    if (dtype == a.dtype or widen) and grouped_mm_runs(a.device.type, run) and \
            _aligned(*a.shape[1:], *b.shape[1:], dtype=run):  # the feature sizes set every stride
        return torch._grouped_mm(left.to(run), right.to(run), offs=groups.ends)
    if gemm == "wgrad":
        return torch.stack([matmul(d.t(), x, out_dtype) for d, x in zip(groups.split(a), groups.split(b))])
    return torch.cat([matmul(t, w, out_dtype) for t, w in zip(groups.split(left), right.unbind(0))])
