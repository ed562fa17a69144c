"""Model adapters: which GEMMs each module of a megatron-core spec runs, read from the spec.

A megatron-core builder describes a layer as a tree of ``ModuleSpec`` objects whose ``submodules``
are dataclasses (``SelfAttentionSubmodules``, ``MLASelfAttentionSubmodules``, ``MLPSubmodules``,
``MoESubmodules``, ...), one field per child module. An ``Adapter`` names, for one such dataclass,
the recipe role (``recipes.operands.ROLE_TABLE``) of each field that holds a GEMM module; how tensor
parallelism splits the module (column or row) is the linear class the builder put there.
``with_backend`` (``layers/backend.py``) walks the spec with these adapters: each GEMM module is
replaced by our quantized one, bound to its role, and a GEMM module at a place no adapter names is
refused in one line (``UnknownModule``), before anything is built. The modules never guess their
role from their attribute name.

docs/extending.md#a-new-model says how to add an adapter for another builder's modules.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping, Optional, Sequence

from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.attention import SelfAttentionSubmodules
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.mlp import MLPSubmodules
from megatron.core.transformer.moe.moe_layer import MoESubmodules
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.multi_latent_attention import MLASelfAttentionSubmodules
from megatron.core.transformer.spec_utils import ModuleSpec

from megatron.quant.recipes.operands import ROLE_BY_NAME, Parallel

GUIDE = "docs/extending.md#a-new-model"
# The module classes that run GEMMs (megatron-core's, and ours, their subclasses): a spec place holding
# one must be named by an adapter. Transformer Engine's modules quantize themselves and are left alone.
GEMM_CLASSES = (ColumnParallelLinear, RowParallelLinear, DotProductAttention, TopKRouter)


@dataclass(frozen=True)
class Adapter:
    """The GEMM modules of one kind of megatron-core submodules: its field -> the module's recipe role."""

    name: str  # in words, for errors and docs
    submodules: type  # the dataclass megatron-core's builders fill
    roles: Mapping[str, str]
    # Fields megatron-core accepts only as its own stock class (it compares the class, not a subclass):
    # they stay stock in the spec and the parent module makes them ours once built (``layers/mla.py``).
    built_stock: frozenset[str] = frozenset()
    # Fields whose output is megatron-core's fused [gate; up] under a gated linear unit (SwiGLU): each
    # tensor-parallel shard holds a slice of both halves, so its runs along out_features split in two.
    fused_gate: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        """ValueError naming a field ``submodules`` lacks (or ``roles`` does not name) or an unknown role."""
        fields = sorted(f.name for f in dataclasses.fields(self.submodules))
        for field in sorted(set(self.roles) - set(fields)):
            raise ValueError(f"adapter {self.name!r}: {self.submodules.__name__} has no field {field!r}; "
                             f"its fields: {', '.join(fields)}")
        for field in sorted((self.built_stock | self.fused_gate) - set(self.roles)):
            raise ValueError(f"adapter {self.name!r}: field {field!r} has no role; give it one in roles")
        for role in sorted(set(self.roles.values()) - set(ROLE_BY_NAME)):
            raise ValueError(f"adapter {self.name!r}: unknown role {role!r}; roles (operands.ROLE_TABLE): "
                             f"{', '.join(ROLE_BY_NAME)}")


# One adapter per kind of submodules megatron-core's GPT builders use (both supported releases).
ADAPTERS = (
    Adapter("GPT self-attention (GQA)", SelfAttentionSubmodules,
            {"linear_qkv": "qkv", "core_attention": "core_attention", "linear_proj": "proj"}),
    Adapter("multi-latent attention (MLA, DeepSeek-V3)", MLASelfAttentionSubmodules,
            {"linear_q_proj": "q", "linear_q_down_proj": "q_down", "linear_q_up_proj": "q_up",
             "linear_kv_down_proj": "kv_down", "linear_kv_up_proj": "kv_up", "core_attention": "core_attention",
             "linear_proj": "proj"},
            # MLASelfAttention: ``submodules.linear_q_down_proj in [TELinear, ..., ColumnParallelLinear]``
            built_stock=frozenset({"linear_q_down_proj", "linear_kv_down_proj"})),
    Adapter("MLP: dense, routed experts (SequentialMLP) and shared experts", MLPSubmodules,
            {"linear_fc1": "fc1", "linear_fc2": "fc2"}, fused_gate=frozenset({"linear_fc1"})),
    Adapter("MoE layer's router", MoESubmodules, {"router": "router"}),
)
ADAPTER_BY_SUBMODULES = {adapter.submodules: adapter for adapter in ADAPTERS}


def adapter_table(adapters: Sequence[Adapter]) -> Mapping[type, Adapter]:
    """Submodules class -> its adapter; ValueError naming a class two adapters claim."""
    table: dict[type, Adapter] = {}
    for adapter in adapters:
        if adapter.submodules in table:
            raise ValueError(f"adapters {table[adapter.submodules].name!r} and {adapter.name!r} both describe "
                             f"{adapter.submodules.__name__}; keep one")
        table[adapter.submodules] = adapter
    return table


@dataclass(frozen=True)
class GemmSlot:
    """One GEMM module of a spec: where it is (field names from the spec's root, e.g.
    ``self_attention.linear_q_down_proj``), its role and how tensor parallelism splits it."""

    path: str
    role: str
    parallel: Optional[Parallel]  # None: split by heads (core attention) or whole on every rank (router)
    module: type
    fused_gate: bool = False  # ``Adapter.fused_gate``


class UnknownModule(ValueError):
    """A GEMM module at a spec place no adapter names."""


def module_class(node: Any) -> Optional[type]:
    """The class a spec place builds: the class itself, a ModuleSpec's or a partial's; None otherwise."""
    if isinstance(node, ModuleSpec):
        node = node.module
    elif isinstance(node, functools.partial):
        node = node.func
    return node if isinstance(node, type) else None


def parallel_of(cls: type) -> Optional[Parallel]:
    """How tensor parallelism splits a module of class ``cls`` (megatron-core's linear classes say it)."""
    if issubclass(cls, ColumnParallelLinear):
        return "column"
    if issubclass(cls, RowParallelLinear):
        return "row"
    return None


Bind = Callable[[Any, GemmSlot, bool], Any]  # (spec place, its slot, built stock?) -> the place's new value


def walk(node: Any, bind: Bind, adapters: Mapping[type, Adapter] = ADAPTER_BY_SUBMODULES,
         parents: Mapping[type, type] = MappingProxyType({})) -> Any:
    """``node`` (a ModuleSpec, submodules, partial or list of them) with each GEMM place the ``adapters``
    (submodules class -> adapter) name replaced by ``bind``'s value and each module class in ``parents``
    by its value there; UnknownModule for a GEMM module at a place no adapter names."""

    def visit(node: Any, path: str) -> Any:
        if isinstance(node, ModuleSpec):
            return dataclasses.replace(node, module=parents.get(node.module, node.module),
                                       submodules=visit(node.submodules, path))
        if isinstance(node, functools.partial):
            return functools.partial(parents.get(node.func, node.func), *visit(node.args, path),
                                     **{key: visit(value, path) for key, value in node.keywords.items()})
        if isinstance(node, (list, tuple)):
            return type(node)(visit(item, f"{path}.{i}" if path else str(i)) for i, item in enumerate(node))
        if isinstance(node, type):  # a bare class, as 0.16's (module, submodules) pairs give one
            return parents.get(node, node)
        if not dataclasses.is_dataclass(node):
            return node
        return visit_submodules(node, path)

    def visit_submodules(node: Any, path: str) -> Any:
        adapter = adapters.get(type(node))
        values = {}
        for field in dataclasses.fields(node):
            if not field.init:
                continue
            value, place = getattr(node, field.name), f"{path}.{field.name}" if path else field.name
            role = adapter.roles.get(field.name) if adapter else None
            cls = module_class(value)
            if role is not None and cls is not None:
                slot = GemmSlot(place, role, parallel_of(cls), cls, field.name in adapter.fused_gate)
                values[field.name] = bind(value, slot, field.name in adapter.built_stock)
            elif cls is not None and issubclass(cls, GEMM_CLASSES):
                name = type(node).__name__
                raise UnknownModule(f"{place}: {cls.__name__} in {name}.{field.name} has no model adapter, so no "
                                    f"recipe role; add one for {name} ({GUIDE})")
            else:
                values[field.name] = visit(value, place)
        return dataclasses.replace(node, **values)

    return visit(node, "")


def gemm_slots(spec: Any, adapters: Sequence[Adapter] = ADAPTERS) -> list[GemmSlot]:
    """Every GEMM module of ``spec``, in spec order, as ``adapters`` name them (UnknownModule as ``walk``)."""
    found: list[GemmSlot] = []

    def record(value: Any, slot: GemmSlot, built_stock: bool) -> Any:
        found.append(slot)
        return value

    walk(spec, record, adapter_table(adapters))
    return found
