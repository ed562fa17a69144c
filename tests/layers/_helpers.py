"""Shared builders for the layer tests: small configs, formats, recording saver."""
from __future__ import annotations

from typing import Any

import torch

from megatron.quant import formats
from megatron.quant.formats.wrapper import FormatWrapper
from megatron.quant.recipes.operands import ATTENTION_OPERANDS, LINEAR_OPERANDS

BLOCK_FORMAT = "mxfp8"        # blocks of 32 along the reduction axis
TENSOR_FORMAT = "fp8_e4m3"    # one scale per tensor (amax)


def transformer_config(**overrides: Any):
    from megatron.core.transformer.transformer_config import TransformerConfig

    values = dict(num_layers=2, hidden_size=128, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=256,
                  normalization="RMSNorm", gated_linear_unit=True, activation_func=torch.nn.functional.silu,
                  add_bias_linear=False, use_cpu_initialization=True, attention_dropout=0.0, hidden_dropout=0.0)
    values.update(overrides)
    return TransformerConfig(**values)


def uniform_formats(keys: tuple[str, ...], name: str | None, **options: Any) -> dict[str, Any]:
    fmt = None if name is None or formats.is_passthrough(name) else formats.get_format(name, **options)
    return {k: fmt for k in keys}


def linear_formats(name: str | None, **options: Any) -> dict[str, Any]:
    return uniform_formats(LINEAR_OPERANDS, name, **options)


def attention_formats(name: str | None, **options: Any) -> dict[str, Any]:
    return uniform_formats(ATTENTION_OPERANDS, name, **options)


def q(x: torch.Tensor, fmt: Any, axis: int) -> torch.Tensor:
    """Reference quantization straight from megatron.quant.formats (identity for no format)."""
    return x if fmt is None else fmt.quantize(x, axis=axis)


def operand(x: torch.Tensor, fmt: Any, axis: int) -> tuple[torch.Tensor, Any]:
    """(GEMM operand, per-tensor scale or None) straight from the format (x itself for no format)."""
    return (x, None) if fmt is None else fmt.quantize_for_gemm(x, axis=axis)


def gemm(product, a: tuple, b: tuple) -> torch.Tensor:
    """The hardware's scaled GEMM: FP32 product of the operands, times their per-tensor scales,
    rounded once to the operands' dtype; a plain product when neither has a scale."""
    (x, sx), (y, sy) = a, b
    if sx is None and sy is None:
        return product(x, y)
    scale = (1.0 if sx is None else sx) * (1.0 if sy is None else sy)
    return (product(x.float(), y.float()) * scale).to(x.dtype)


class RecordingSaver:
    """Stands in for tensor_saver's is_active/capture; records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str, dict]] = []

    def install(self, monkeypatch) -> "RecordingSaver":
        from megatron.quant import tensor_saver

        monkeypatch.setattr(tensor_saver, "is_active", lambda: True)
        monkeypatch.setattr(tensor_saver, "capture",
                            lambda site, op, phase, tensors: self.calls.append((site.module, op, phase, dict(tensors))))
        return self

    def names(self) -> list[tuple[str, str, tuple[str, ...]]]:
        return [(op, phase, tuple(sorted(t))) for _, op, phase, t in self.calls]


class CountingFormat(FormatWrapper):
    """Delegates to a real format; counts all quantizations and those of weight-shaped tensors."""

    def __init__(self, fmt, weight_shape=()):
        super().__init__(fmt)
        self.weight_shape, self.weight_calls, self.calls = tuple(weight_shape), 0, 0

    def _count(self, x):
        self.calls += 1
        self.weight_calls += tuple(x.shape) == self.weight_shape

    def run(self, x, axis=-1, amax=None, **kwargs):  # every quantization goes through ``run``
        self._count(x)
        return self.fmt.run(x, axis, amax, **kwargs)


def moe_config(**overrides: Any):
    """``transformer_config`` with 4 routed experts (top-2, 64 wide) and one shared expert, run as on CPU:
    SequentialMLP experts, the all-gather dispatcher, an FP32 router."""
    values = dict(num_moe_experts=4, moe_router_topk=2, moe_ffn_hidden_size=64, moe_shared_expert_intermediate_size=64,
                  moe_grouped_gemm=False, moe_token_dispatcher_type="allgather", moe_router_dtype="fp32",
                  bias_activation_fusion=False)
    values.update(overrides)
    return transformer_config(**values)


def moe_layer(config, layer_idx: int = 0):
    """One MoE TransformerLayer from megatron-core's local spec with our backend, finished as ``GPTModel``
    finishes ``decoder.layers.<layer_idx>``."""
    from megatron.core.transformer.transformer_layer import TransformerLayer

    layer = TransformerLayer(config, _moe_spec(config).submodules, layer_number=layer_idx + 1)
    _finish(layer, config, f"decoder.layers.{layer_idx}.")
    return layer


def moe_mlp(config, layer_idx: int = 0):
    """The MoE layer (``MoELayer``: router, experts, shared experts) of ``moe_layer`` alone: no norms, so
    sequence parallelism builds without Transformer Engine."""
    from megatron.core.transformer.spec_utils import ModuleSpec, build_module

    spec = _moe_spec(config).submodules.mlp  # 0.19: a partial of MoELayer
    moe = build_module(spec, config=config) if isinstance(spec, ModuleSpec) else spec(config=config)
    _finish(moe, config, f"decoder.layers.{layer_idx}.mlp.")
    return moe


def _moe_spec(config):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from megatron.quant.layers.backend import QuantSpecProvider, with_backend

    return with_backend(get_gpt_layer_local_spec(num_experts=config.num_moe_experts, normalization="RMSNorm"),
                        QuantSpecProvider())


def _finish(module, config, prefix: str) -> None:
    from megatron.quant.layers.module_quant import finish_init

    finish_init(module, config, prefix=prefix)
