"""Quantized subclass of megatron-core's DotProductAttention.

Unfused path (exact, every operand): S = Q K^T * scale, megatron-core's own mask + softmax
(+ dropout), O = P V, both products through ``QuantBmmFunction`` so Q, K, P, V and the
backward GEMMs' operands (dQ = dS K, dK = dS^T Q, dP = dO V^T, dV = P^T dO) are quantized
per the recipe. With nothing quantized it runs megatron-core's exact operations.

Fused path, chosen automatically when some of Q/K/V but not P is quantized (round-to-nearest),
with no dropout:
``scaled_dot_product_attention`` on the quantized Q, K, V (no [s, s] tensor kept), and a
backward that recomputes the unfused path (as flash attention does), so its gradients are
those of the unfused path and backward-operand formats still apply.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from megatron.core import tensor_parallel
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType

from megatron.quant.ops import (BmmQuant, CaptureGradients, QuantBmmFunction, capturing, captured_operand,
                                quantize_operand, recompute_backward)
from megatron.quant.recipe import PV_OPERANDS, QK_OPERANDS
from megatron.quant import tensor_saver
from megatron.quant.tensor_saver import CaptureSite


@dataclass(frozen=True)
class AttentionQuant:
    qk: BmmQuant = BmmQuant()   # S = Q @ K^T   (A = Q [bn, sq, hn], B = K^T [bn, hn, sk])
    pv: BmmQuant = BmmQuant()   # O = P @ V     (A = P [bn, sq, sk], B = V [bn, sk, hn])

    @classmethod
    def from_formats(cls, formats: Mapping[str, Any]) -> "AttentionQuant":
        return cls(qk=BmmQuant.from_formats(formats, QK_OPERANDS), pv=BmmQuant.from_formats(formats, PV_OPERANDS))

    @property
    def fusable(self) -> bool:
        """SDPA can apply it: Q/K/V quantized before the kernel, P untouched, and Q/K/V rounded
        deterministically (the backward recomputes the forward and must see the same values)."""
        qkv = [s.fmt for s in (self.qk.a, self.qk.b, self.pv.b) if s.fmt is not None]
        return (self.pv.a.fmt is None and bool(qkv)
                and all(f.options.get("rounding", "nearest") != "stochastic" for f in qkv))


class _FusedAttention(torch.autograd.Function):
    """SDPA forward on quantized Q/K/V; backward by recomputing the unfused path."""

    @staticmethod
    def forward(ctx, query: Tensor, key: Tensor, value: Tensor, attn: "QuantDotProductAttention",
                attention_mask: Optional[Tensor], amaxes: Optional[dict]) -> Tensor:
        ctx.attn, ctx.attention_mask = attn, attention_mask
        ctx.save_for_backward(query, key, value)
        return attn._sdpa(query, key, value, attention_mask, amaxes)

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        attn, mask = ctx.attn, ctx.attention_mask
        grads = recompute_backward(lambda q, k, v: attn._unfused(q, k, v, mask), ctx.saved_tensors, grad_output)
        return grads + (None, None, None)


class QuantDotProductAttention(DotProductAttention):
    """DotProductAttention with fake-quantized GEMM operands; stock until ``configure_quant``."""

    quant: Optional[AttentionQuant] = None
    capture_site: Optional[CaptureSite] = None
    allow_fused: bool = True

    def configure_quant(self, quant: AttentionQuant, site: Optional[CaptureSite], allow_fused: bool = True) -> None:
        self.quant, self.capture_site, self.allow_fused = quant, site, allow_fused

    def uses_fused_path(self, query: Tensor, key: Tensor, attention_mask: Optional[Tensor]) -> bool:
        """True when this call would take the SDPA path (see the module docstring)."""
        return (self.allow_fused and self.quant.fusable and query.size(0) == key.size(0)
                and (self.attention_dropout.p == 0.0 or not self.training)
                and self.softmax_offset is None and self.scale_mask_softmax.scale is None
                and (attention_mask is not None or self.attn_mask_type in (AttnMaskType.causal,
                                                                            AttnMaskType.no_mask)))

    def forward(self, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
                attn_mask_type: Optional[AttnMaskType] = None, attention_bias: Optional[Tensor] = None,
                packed_seq_params=None) -> Tensor:
        if self.quant is None:
            return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias,
                                   packed_seq_params)
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError("QuantDotProductAttention supports neither packed sequences nor attention_bias "
                             "(as megatron-core's DotProductAttention)")
        site = self.capture_site
        capture = capturing(site)
        amaxes = {} if capture else None  # the (TP-reduced) amaxes the GEMMs used, for the capture
        inputs = (query, key, value)
        if capture:
            query, key, value = CaptureGradients.apply(site, "post", ("grad_query", "grad_key", "grad_value"),
                                                       query, key, value)
        if self.uses_fused_path(query, key, attention_mask):
            context = _FusedAttention.apply(query, key, value, self, attention_mask, amaxes)
        else:
            context = self._unfused(query, key, value, attention_mask, amaxes)
        if capture:
            self._capture_inputs(*inputs, amaxes)
            tensor_saver.capture(site, "forward", "post", {"output": context})
            (context,) = CaptureGradients.apply(site, "pre", ("grad_output",), context)
        return context

    def _capture_inputs(self, query: Tensor, key: Tensor, value: Tensor, amaxes: dict) -> None:
        # Megatron layout [s, b, heads, hn]: Q/K blocks along hn (last), V blocks along keys (dim 0):
        # the values the GEMMs used after their reshapes, re-quantized with the amaxes they used
        # (no collective here: capture may be active on some ranks only).
        specs = {"query": (query, replace(self.quant.qk.a, axis=-1)),
                 "key": (key, replace(self.quant.qk.b, axis=-1)),
                 "value": (value, replace(self.quant.pv.b, axis=0))}
        named = {name: captured_operand(x, spec, amaxes.get(name)) for name, (x, spec) in specs.items()}
        tensor_saver.capture(self.capture_site, "forward", "pre", named)

    def _unfused(self, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
                 amaxes: Optional[dict] = None) -> Tensor:
        """megatron-core's DotProductAttention.forward with the two products quantized."""
        group = self.tp_group
        rep = self.num_attention_heads_per_partition // self.num_query_groups_per_partition
        if rep > 1:
            key = key.repeat_interleave(rep, dim=2)
            value = value.repeat_interleave(rep, dim=2)
        sq, b, heads, _ = query.shape
        sk = key.size(0)
        query = query.reshape(sq, b * heads, -1)
        key = key.view(sk, b * heads, -1)
        scores = QuantBmmFunction.apply(query.transpose(0, 1), key.transpose(0, 1).transpose(1, 2),
                                        self.softmax_scale, self.quant.qk, group, amaxes, ("query", "key"))
        probs = self.scale_mask_softmax(scores.view(b, heads, sq, sk), attention_mask, self.softmax_offset)
        if not self.config.sequence_parallel:
            with tensor_parallel.get_cuda_rng_tracker().fork():
                probs = self.attention_dropout(probs)
        else:
            probs = self.attention_dropout(probs)
        value = value.view(sk, b * heads, -1)
        probs = probs.view(b * heads, sq, -1)
        context = QuantBmmFunction.apply(probs, value.transpose(0, 1), None, self.quant.pv, group, amaxes,
                                         ("probs", "value"))
        context = context.view(b, heads, sq, -1).permute(2, 0, 1, 3).contiguous()
        return context.view(sq, b, self.hidden_size_per_partition)

    def _sdpa(self, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
              amaxes: Optional[dict] = None) -> Tensor:
        group = self.tp_group
        # [s, b, heads, hn] -> [b, heads, s, hn]; GQA stays unexpanded (enable_gqa).
        q, q_amax = quantize_operand(query.permute(1, 2, 0, 3), replace(self.quant.qk.a, axis=-1), group)
        k, k_amax = quantize_operand(key.permute(1, 2, 0, 3), replace(self.quant.qk.b, axis=-1), group)
        v, v_amax = quantize_operand(value.permute(1, 2, 0, 3), replace(self.quant.pv.b, axis=-2), group)
        if amaxes is not None:
            amaxes.update(query=q_amax, key=k_amax, value=v_amax)
        causal = attention_mask is None and self.attn_mask_type == AttnMaskType.causal
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=None if attention_mask is None else ~attention_mask, is_causal=causal,
            scale=self.softmax_scale, enable_gqa=q.size(1) != k.size(1))
        sq, b = query.shape[:2]
        return out.permute(2, 0, 1, 3).reshape(sq, b, self.hidden_size_per_partition)
