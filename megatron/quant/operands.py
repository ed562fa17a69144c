"""Names shared by recipes, layers and capture: module roles and GEMM operand keys.

The bottom of the package's import graph: it imports nothing of ours, so the capture
filters, the recipe parser and the layers can all name operands without importing each other.
"""
from __future__ import annotations

LINEAR_OPERANDS = ("fprop.input", "fprop.weight", "dgrad.grad_output", "dgrad.weight",
                   "wgrad.grad_output", "wgrad.input")
# Forward GEMM and the two backward GEMMs that differentiate it, per attention product.
QK_OPERANDS = ("qk.query", "qk.key", "dq.grad_scores", "dq.key", "dk.query", "dk.grad_scores")
PV_OPERANDS = ("pv.probs", "pv.value", "dp.grad_output", "dp.value", "dv.probs", "dv.grad_output")
ATTENTION_OPERANDS = QK_OPERANDS + PV_OPERANDS
ALL_OPERANDS = LINEAR_OPERANDS + ATTENTION_OPERANDS

LINEAR_ROLES = ("qkv", "proj", "fc1", "fc2")
ROLES = LINEAR_ROLES + ("core_attention", "output_layer")
SCOPES = {"linear": LINEAR_OPERANDS, "attention": ATTENTION_OPERANDS,
          "attention.qk": QK_OPERANDS, "attention.pv": PV_OPERANDS}


def operands_for_role(role: str) -> tuple[str, ...]:
    return ATTENTION_OPERANDS if role == "core_attention" else LINEAR_OPERANDS
