"""Names shared by recipes, layers and capture: module roles (``ROLE_TABLE``), the GEMM operands (``LINEAR_TABLE``:
one record per linear operand, its key, GEMM, block axis, TP shard dimensions and capture;
``BMM_SLOTS`` and the attention keys), and ``OperandSpec`` (how one operand is quantized).

The bottom of the package's import graph: it imports nothing of ours at run time but the rounding
vocabulary (``formats.rounding``, which imports nothing of ours), so the capture
filters, the recipe parser and the layers can all name operands without importing each other.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Optional

from megatron.quant.formats.rounding import is_stochastic

if TYPE_CHECKING:
    import torch

    from megatron.quant.formats.interface import QuantFormat

Parallel = Literal["column", "row"]
"""How tensor parallelism splits a linear layer's weight: ``"column"`` along out_features
(ColumnParallelLinear), ``"row"`` along in_features (RowParallelLinear)."""
OperandRole = Literal["input", "weight", "grad_output"]
"""The tensor a linear GEMM operand quantizes; also the name the layer captures it under."""
Pass = Literal["forward", "backward"]


@dataclass(frozen=True)
class LinearOperand:
    """One operand of a linear layer's three GEMMs, on the 2-D views they multiply ([tokens, features];
    W [out_features, in_features]): Y = X W^T (fprop), dX = dY W (dgrad), dW = dY^T X (wgrad)."""

    gemm: str  # "fprop" | "dgrad" | "wgrad"
    role: OperandRole
    axis: int  # the block axis: the GEMM's reduction dimension
    column_shard: Optional[int]  # the dimension a column-parallel layer splits across TP ranks; None: whole
    row_shard: Optional[int]  # the same in a row-parallel layer
    captured: Pass  # the pass whose pre-GEMM capture holds its tensor

    @property
    def key(self) -> str:
        """The recipe operand key, e.g. "fprop.input"."""
        return f"{self.gemm}.{self.role}"

    @property
    def backward(self) -> bool:
        """An operand of a backward GEMM (dgrad, wgrad)."""
        return self.gemm != "fprop"

    @property
    def along_tokens(self) -> bool:
        """Blocked along tokens (an activation or gradient reduced over tokens, as wgrad's are)."""
        return self.role != "weight" and self.axis == 0

    def shard_dim(self, parallel: Parallel) -> Optional[int]:
        return self.column_shard if parallel == "column" else self.row_shard


# The one description of the linear operands: the layers (``LinearQuant``: specs, shard dimensions,
# each GEMM's operands; the block checks against TP shards), the recipes' keys and axes and the
# what-if comparison (which capture feeds which operand, on which view) all derive from it. Within a
# capture the first operand in this order is the one the layer records (its axis is the capture's).
LINEAR_TABLE = (
    LinearOperand("fprop", "input", axis=-1, column_shard=None, row_shard=-1, captured="forward"),
    LinearOperand("fprop", "weight", axis=1, column_shard=0, row_shard=1, captured="forward"),
    LinearOperand("dgrad", "grad_output", axis=-1, column_shard=-1, row_shard=None, captured="backward"),
    LinearOperand("dgrad", "weight", axis=0, column_shard=0, row_shard=1, captured="backward"),
    LinearOperand("wgrad", "grad_output", axis=0, column_shard=-1, row_shard=None, captured="backward"),
    LinearOperand("wgrad", "input", axis=0, column_shard=None, row_shard=-1, captured="forward"),
)


@dataclass(frozen=True)
class BmmSlot:
    """One operand position of C = A @ B (A [n, m, k], B [n, k, p]) and its backward GEMMs; ``name``
    is ``layers.bmm_function.BmmQuant``'s field for it."""

    name: str
    gemm: str  # "forward" | "grad A" | "grad B"
    axis: int  # the block axis: the GEMM's reduction dimension


# Forward along k, dA = dC B^T along p, dB = A^T dC along m; every operand's batch dimension (0) is
# split across TP ranks by heads.
BMM_SLOTS = (BmmSlot("a", "forward", -1), BmmSlot("b", "forward", -2),
             BmmSlot("grad_a_dc", "grad A", -1), BmmSlot("grad_a_b", "grad A", -1),
             BmmSlot("grad_b_a", "grad B", -2), BmmSlot("grad_b_dc", "grad B", -2))
# Attention's two products, their operands' recipe keys in ``BMM_SLOTS`` order.
QK_OPERANDS = ("qk.query", "qk.key", "dq.grad_scores", "dq.key", "dk.query", "dk.grad_scores")
PV_OPERANDS = ("pv.probs", "pv.value", "dp.grad_output", "dp.value", "dv.probs", "dv.grad_output")

LINEAR_OPERANDS = tuple(op.key for op in LINEAR_TABLE)
LINEAR_GEMMS = tuple(dict.fromkeys(op.gemm for op in LINEAR_TABLE))  # fprop, dgrad, wgrad
LINEAR_BY_KEY = {op.key: op for op in LINEAR_TABLE}
BACKWARD_LINEAR_OPERANDS = tuple(op.key for op in LINEAR_TABLE if op.backward)
# A backward operand whose tensor the forward quantizes too (TE's columnwise copy of the input and of the
# weight) -> that forward operand: the one it can be taken from, dequantized (``columnwise_source``).
FORWARD_TWINS = {op.key: twin.key for op in LINEAR_TABLE if op.backward
                 for twin in LINEAR_TABLE if not twin.backward and twin.role == op.role}
TWINNED_ROLES = tuple(dict.fromkeys(LINEAR_BY_KEY[key].role for key in FORWARD_TWINS))
ATTENTION_OPERANDS = QK_OPERANDS + PV_OPERANDS
ALL_OPERANDS = LINEAR_OPERANDS + ATTENTION_OPERANDS
# The operands of the forward GEMMs (the rest are the backward GEMMs'): what a scheduled phase's
# ``forward`` recipe switches (``recipes.schedule``).
FORWARD_OPERANDS = (tuple(op.key for op in LINEAR_TABLE if op.gemm == "fprop")
                    + tuple(key for keys in (QK_OPERANDS, PV_OPERANDS)
                            for key, slot in zip(keys, BMM_SLOTS) if slot.gemm == "forward"))


@dataclass(frozen=True)
class Role:
    """A module role: the name recipes, precision files and captures use, the GEMMs the module runs
    (``LINEAR_TABLE``'s or the attention products'), and the layer part it belongs to. Which module of
    a model has which role is the model adapters' business (``layers/adapters.py``), read from the spec
    megatron-core builds it from; how tensor parallelism splits it, from the linear class there."""

    name: str
    gemms: Literal["linear", "attention"]
    part: Literal["attention", "mla", "mlp", "moe", "head"]
    # Stays in high precision unless a recipe rule names it, as Transformer Engine and DeepSeek-V3 keep
    # the LM head and the MoE router (its gating GEMM, X W^T over the experts).
    named_only: bool = False


# The one table of module roles: the recipes' role names (``ROLES``), their operands and their defaults
# derive from it. "proj" and "core_attention" are both attentions': GQA's and multi-latent attention's.
ROLE_TABLE = (
    Role("qkv", "linear", "attention"),
    Role("proj", "linear", "attention"),
    Role("fc1", "linear", "mlp"),
    Role("fc2", "linear", "mlp"),
    Role("core_attention", "attention", "attention"),
    Role("output_layer", "linear", "head", named_only=True),
    Role("router", "linear", "moe", named_only=True),
    # Multi-latent attention (DeepSeek-V3): queries and keys/values through low-rank latents.
    Role("q", "linear", "mla"),  # the query projection of an MLA without a query latent (q_lora_rank None)
    Role("q_down", "linear", "mla"),
    Role("q_up", "linear", "mla"),
    Role("kv_down", "linear", "mla"),
    Role("kv_up", "linear", "mla"),
)
ROLE_BY_NAME = {role.name: role for role in ROLE_TABLE}
ROLES = tuple(ROLE_BY_NAME)
# The linear roles of a Llama (GQA) layer, and those multi-latent attention has instead of "qkv".
LINEAR_ROLES = tuple(r.name for r in ROLE_TABLE if r.gemms == "linear" and r.part in ("attention", "mlp"))
MLA_ROLES = tuple(r.name for r in ROLE_TABLE if r.part == "mla")
DECODER_LINEAR_ROLES = LINEAR_ROLES + MLA_ROLES  # every decoder layer's linear GEMMs, GQA or MLA attention
NAMED_ONLY_ROLES = tuple(r.name for r in ROLE_TABLE if r.named_only)

# Block axes are fixed by the GEMMs: each operand is blocked along its GEMM's reduction dimension.
LINEAR_AXES = {op.key: op.axis for op in LINEAR_TABLE}
BMM_AXES = tuple(slot.axis for slot in BMM_SLOTS)
OPERAND_AXES = {**LINEAR_AXES, **dict(zip(QK_OPERANDS, BMM_AXES)), **dict(zip(PV_OPERANDS, BMM_AXES))}

SCOPES = {"linear": LINEAR_OPERANDS, "attention": ATTENTION_OPERANDS,
          "attention.qk": QK_OPERANDS, "attention.pv": PV_OPERANDS}


def operands_for_role(role: str) -> tuple[str, ...]:
    return ATTENTION_OPERANDS if ROLE_BY_NAME[role].gemms == "attention" else LINEAR_OPERANDS


@dataclass(frozen=True)
class OperandSpec:
    """How one GEMM operand is fake-quantized: ``fmt`` None means not at all."""

    fmt: Optional["QuantFormat"] = None
    axis: int = -1
    name: str = ""  # recipe operand key ("fprop.input", ...): names its stochastic-rounding stream
    shard_dim: Optional[int] = None  # the dimension split across TP ranks; None: the same on every rank
    shard_groups: int = 1  # runs along shard_dim split separately (SwiGLU's fused [gate; up] in fc1)
    # The layer's amax history for a delayed-scaled format: a ``layers.delayed.AmaxHistory``, typed by its
    # base class here (the layers are above the recipes).
    history: Optional["torch.nn.Module"] = None

    @property
    def stochastic(self) -> bool:
        return self.fmt is not None and is_stochastic(self.fmt.rounding)
