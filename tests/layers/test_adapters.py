"""Model adapters: each GEMM module's recipe role and tensor-parallel split come from the spec megatron-core's
builders return (GPT with GQA, with multi-latent attention, with MoE), in both supported releases; a GEMM
module at a place no adapter names is refused in one line before anything is built; a quantized module
built outside such a spec has no role and is refused when a recipe reaches it."""
import dataclasses
import re
from pathlib import Path

import pytest
import torch
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.tensor_parallel import ColumnParallelLinear
from megatron.core.transformer.spec_utils import ModuleSpec

from megatron.quant.layers.adapters import GUIDE, Adapter, UnknownModule, gemm_slots
from megatron.quant.layers.backend import QuantSpecProvider, with_backend
from megatron.quant.layers.linear import QuantColumnParallelLinear, QuantRowParallelLinear
from megatron.quant.layers.spec import precision_config
from megatron.quant.recipes.operands import MLA_ROLES, ROLES
from megatron.quant.recipes.recipe import QuantRecipe
from tests.layers._helpers import transformer_config

ATTENTION = [("self_attention.linear_qkv", "qkv", "column"), ("self_attention.core_attention", "core_attention", None),
             ("self_attention.linear_proj", "proj", "row")]
MLA = [("self_attention.linear_q_proj", "q", "column"), ("self_attention.linear_q_down_proj", "q_down", "column"),
       ("self_attention.linear_q_up_proj", "q_up", "column"),
       ("self_attention.linear_kv_down_proj", "kv_down", "column"),
       ("self_attention.linear_kv_up_proj", "kv_up", "column"),
       ("self_attention.core_attention", "core_attention", None), ("self_attention.linear_proj", "proj", "row")]
MLP = [("mlp.linear_fc1", "fc1", "column"), ("mlp.linear_fc2", "fc2", "row")]
MOE = [("mlp.experts.linear_fc1", "fc1", "column"), ("mlp.experts.linear_fc2", "fc2", "row"),
       ("mlp.shared_experts.linear_fc1", "fc1", "column"), ("mlp.shared_experts.linear_fc2", "fc2", "row"),
       ("mlp.router", "router", None)]


@pytest.mark.parametrize("builder, expected", [
    (dict(), ATTENTION + MLP),
    (dict(multi_latent_attention=True, qk_layernorm=True), MLA + MLP),
    (dict(num_experts=4), ATTENTION + MOE),
    (dict(num_experts=4, multi_latent_attention=True), MLA + MOE),
], ids=["gqa", "mla", "moe", "mla-moe"])
def test_each_gemm_module_takes_its_role_and_split_from_the_spec(builder, expected):
    spec = get_gpt_layer_local_spec(normalization="RMSNorm", **builder)
    expected_slots = {path: (role, parallel) for path, role, parallel in expected}  # field order: the release's
    assert {s.path: (s.role, s.parallel) for s in gemm_slots(spec)} == expected_slots
    ours = with_backend(spec, QuantSpecProvider())
    assert {s.path: (s.role, s.parallel) for s in gemm_slots(ours)} == expected_slots  # the split survives the swap
    bound = {s.path: s.module for s in gemm_slots(ours)}
    for path, role, parallel in expected:  # each linear built as ours, bound to its role ...
        place = _place(ours, path)
        if path.endswith(("q_down_proj", "kv_down_proj")):  # MLA: stock, made ours once built
            assert place is ColumnParallelLinear
        elif parallel is not None:
            assert place.module is {"column": QuantColumnParallelLinear, "row": QuantRowParallelLinear}[parallel]
            assert place.params["gemm_role"] == role
            assert place.params.get("fused_gate", False) == (role == "fc1")  # megatron-core's [gate; up]
        else:
            assert bound[path].__module__.startswith("megatron.quant.layers")
    assert set(MLA_ROLES) <= set(ROLES)


def _place(spec, path):
    node = spec
    for name in path.split("."):
        node = node.submodules if isinstance(node, ModuleSpec) else node.keywords["submodules"]  # 0.19: partials
        node = getattr(node, name)
    return node


@dataclasses.dataclass
class _LoRASubmodules:
    linear_a: type = ColumnParallelLinear


def test_a_gemm_module_no_adapter_names_is_refused_in_one_line():
    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    custom = dataclasses.replace(spec.submodules, self_attention=ModuleSpec(module=torch.nn.Identity,
                                                                            submodules=_LoRASubmodules()))
    with pytest.raises(UnknownModule) as refused:
        with_backend(dataclasses.replace(spec, submodules=custom), QuantSpecProvider())
    assert str(refused.value) == (
        "self_attention.linear_a: ColumnParallelLinear in _LoRASubmodules.linear_a has no model adapter, so no "
        "recipe role; add one for _LoRASubmodules (docs/extending.md#a-new-model)")
    page, anchor = GUIDE.split("#")
    headings = re.findall(r"^#+ (.+)$", (Path(__file__).parents[2] / page).read_text(), re.M)
    assert anchor in {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in headings}


def test_a_quantized_module_built_without_a_role_is_refused_when_a_recipe_reaches_it(parallel):
    config = transformer_config(quant_recipe=precision_config(QuantRecipe.uniform("mxfp8")))
    layer = QuantColumnParallelLinear(64, 64, config=config, init_method=torch.nn.init.normal_, bias=False,
                                      gather_output=False)
    from megatron.quant.layers.module_quant import finish_init

    with pytest.raises(ValueError, match=r"^decoder.layers.0.self_attention.linear_x: module role None is not a "
                                         r"recipe role \(qkv, proj, .*docs/extending.md#a-new-model\)$"):
        finish_init(torch.nn.ModuleDict({"linear_x": layer}), config, prefix="decoder.layers.0.self_attention.")
    assert layer.quant is None  # nothing configured


@pytest.mark.parametrize("role", MLA_ROLES)
def test_what_if_formats_reach_the_mla_projections_captures(role):
    from megatron.quant.capture.whatif import WhatIfFormats

    fmt, _ = WhatIfFormats().format_for("mxfp8", "decoder.layers.0.self_attention.linear_x", role, 0, "input")
    assert fmt.name == "mxfp8_e4m3"


def test_an_adapter_naming_a_missing_field_or_an_unknown_role_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^adapter 'lora': _LoRASubmodules has no field 'linear_b'; its fields: "
                                         r"linear_a$"):
        Adapter("lora", _LoRASubmodules, {"linear_b": "fc1"})
    with pytest.raises(ValueError, match=r"^adapter 'lora': unknown role 'lora_a'; roles \(operands.ROLE_TABLE\): "
                                         r"qkv, proj, fc1, .*, kv_up$"):
        Adapter("lora", _LoRASubmodules, {"linear_a": "lora_a"})


def test_the_deepseek_fp8_preset_runs_mla_projections_in_fp8_and_its_attention_in_high_precision():
    recipe = QuantRecipe.from_dict({"format": "deepseek-v3-fp8"})
    for role in ("q_down", "q_up", "kv_down", "kv_up", "proj"):
        assert {f.name for f in recipe.resolve(role, 1, 2).values()} == {"fp8_e4m3"}, role
    assert set(recipe.resolve("core_attention", 1, 2).values()) == {None}
