"""Names shared by recipes, layers and capture: module roles, GEMM operand keys, the axis each
operand's blocks run along, and ``OperandSpec`` (how one operand is quantized).

The bottom of the package's import graph: it imports nothing of ours at run time, so the capture
filters, the recipe parser and the layers can all name operands without importing each other.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from megatron.quant.recipes.delayed import AmaxHistory

LINEAR_OPERANDS = ("fprop.input", "fprop.weight", "dgrad.grad_output", "dgrad.weight",
                   "wgrad.grad_output", "wgrad.input")
# Forward GEMM and the two backward GEMMs that differentiate it, per attention product.
QK_OPERANDS = ("qk.query", "qk.key", "dq.grad_scores", "dq.key", "dk.query", "dk.grad_scores")
PV_OPERANDS = ("pv.probs", "pv.value", "dp.grad_output", "dp.value", "dv.probs", "dv.grad_output")
ATTENTION_OPERANDS = QK_OPERANDS + PV_OPERANDS
ALL_OPERANDS = LINEAR_OPERANDS + ATTENTION_OPERANDS

LINEAR_ROLES = ("qkv", "proj", "fc1", "fc2")
ROLES = LINEAR_ROLES + ("core_attention", "output_layer")
# Block axes are fixed by the GEMMs: each operand is blocked along its GEMM's reduction dimension.
# Linear layers, on 2-D views ([tokens, features]; W [out, in]):
LINEAR_AXES = {"fprop.input": -1, "fprop.weight": 1,             # Y = X W^T: along in_features
               "dgrad.grad_output": -1, "dgrad.weight": 0,        # dX = dY W: along out_features
               "wgrad.grad_output": 0, "wgrad.input": 0}          # dW = dY^T X: along tokens
# C = A @ B (A [n, m, k], B [n, k, p]) and its backward GEMMs, in QK_/PV_OPERANDS order:
# forward along k, dA = dC B^T along p, dB = A^T dC along m.
BMM_AXES = (-1, -2, -1, -1, -2, -2)
OPERAND_AXES = {**LINEAR_AXES, **dict(zip(QK_OPERANDS, BMM_AXES)), **dict(zip(PV_OPERANDS, BMM_AXES))}

SCOPES = {"linear": LINEAR_OPERANDS, "attention": ATTENTION_OPERANDS,
          "attention.qk": QK_OPERANDS, "attention.pv": PV_OPERANDS}


def operands_for_role(role: str) -> tuple[str, ...]:
    return ATTENTION_OPERANDS if role == "core_attention" else LINEAR_OPERANDS


@dataclass(frozen=True)
class OperandSpec:
    """How one GEMM operand is fake-quantized: ``fmt`` None means not at all."""

    fmt: Any = None  # megatron.quant.formats.NumericFormat
    axis: int = -1
    name: str = ""  # recipe operand key ("fprop.input", ...): names its stochastic-rounding stream
    shard_dim: Optional[int] = None  # the dimension split across TP ranks; None: the same on every rank
    shard_groups: int = 1  # runs along shard_dim split separately (SwiGLU's fused [gate; up] in fc1)
    history: Optional["AmaxHistory"] = None  # the layer's amax history for a delayed-scaled format

    @property
    def stochastic(self) -> bool:
        return self.fmt is not None and self.fmt.rounding == "stochastic"
