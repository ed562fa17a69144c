"""Quantized subclass of megatron-core's DotProductAttention.

Q, K and V are quantized once, in megatron's [s, b, heads, hn] layout and before GQA expands
K and V to every query head (as an FP8 attention kernel receives them): Q and K in blocks along
hn, V along the keys. That one quantization feeds the GEMMs, the fused path and the capture,
so they all see the same values. Then one of four paths (``path``; the training start line names it):

Unquantized path (``sdpa``), chosen automatically when nothing in either product is quantized and
SDPA reproduces megatron-core's mask and dropout (the conditions of the fused path below):
``scaled_dot_product_attention`` on Q, K, V with its own backward (flash / cuDNN attention on a
GPU, no [s, s] tensor), as Transformer Engine's fused attention serves a Megatron-LM bf16 run. It is
not bit-identical to the unfused path (another summation order; tests/layers/test_attention.py
states the tolerance). ``allow_fused=False`` (``CUSTOM_QUANT_FUSIONS=off``) keeps megatron-core's
exact operations.

Unfused path (exact, every operand): S = Q K^T * scale, megatron-core's own mask + softmax
(+ dropout), O = P V, both products through ``QuantBmmFunction`` so P and the backward GEMMs'
operands (dQ = dS K, dK = dS^T Q, dP = dO V^T, dV = P^T dO) are quantized per the recipe.
With nothing quantized it runs megatron-core's exact operations.

Fused quantized path (``sdpa-quantized``), chosen automatically when some of Q/K/V but not P is
quantized, none of them with a per-tensor scale, no dropout, and a mask SDPA reproduces exactly
(causal or none; not a sliding window, not an explicit mask, whose fully masked rows megatron-core
fills differently):
``scaled_dot_product_attention`` on the quantized Q, K, V (no [s, s] tensor kept), and a
backward that recomputes the unfused path on the same quantized Q, K, V (as flash attention
does), so its gradients are those of the unfused path and backward-operand formats still apply.

Flash quantized path (``flash-quantized``), chosen on a GPU (``CUSTOM_QUANT_KERNELS`` auto or triton; on a
CPU with triton under Triton's interpreter) where SDPA's
conditions hold, P or dS is quantized, no operand has a per-tensor scale or stochastic rounding, and the
kernels apply P's and dS's formats themselves (``kernels.flash_attention_formats``: elementwise, or MX
blocks of 16 or 32): ``kernels.flash_attention``, forward and backward, no [s, s] tensor. Where it is
chosen or could be (the same case on a CPU), the unfused path's softmax is the kernels'
(``kernels.flash_attention_softmax``: a defined exp and sum order, a few ulps from torch.softmax), so
both paths compute the same P; their outputs and gradients are equal bit for bit where the GEMMs' float32
sums are exact (``tests/kernels/test_flash_attention.py``).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel
from megatron.core.quantization.quant_config import QuantizationConfig
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint
from torch import Tensor

from megatron.quant import tensor_saver
from megatron.quant.formats.random_bits import RandomBits
from megatron.quant.kernels import backend, interpreting, triton_available
from megatron.quant.kernels.flash_attention_formats import TileFormats, tile_formats
from megatron.quant.kernels.flash_attention_softmax import DefinedSoftmax
from megatron.quant.layers.bmm_function import (
    BmmOperands,
    BmmQuant,
    CaptureGradients,
    QuantBmmFunction,
    recompute_backward,
)
from megatron.quant.layers.delayed import HISTORIES, amax_reduction_group
from megatron.quant.layers.histories import attach_histories
from megatron.quant.layers.module_quant import FinishesInit, module_quant
from megatron.quant.layers.operand import (
    NoiseScope,
    Quantized,
    capturing,
    module_noise_root,
    noise_scope,
    quantize_operand,
)
from megatron.quant.layers.phases import Phased
from megatron.quant.recipes.operands import PV_OPERANDS, QK_OPERANDS
from megatron.quant.tensor_saver import CaptureSite

_HEADS = 2  # the heads dimension of megatron's [s, b, heads, hn]: what tensor parallelism splits


@dataclass(frozen=True)
class AttentionQuant:
    qk: BmmQuant = BmmQuant()   # S = Q @ K^T   (A = Q [bn, sq, hn], B = K^T [bn, hn, sk])
    pv: BmmQuant = BmmQuant()   # O = P @ V     (A = P [bn, sq, sk], B = V [bn, sk, hn])

    @classmethod
    def from_formats(cls, formats: Mapping[str, Any]) -> "AttentionQuant":
        return cls(qk=BmmQuant.from_formats(formats, QK_OPERANDS), pv=BmmQuant.from_formats(formats, PV_OPERANDS))

    @property
    def inputs(self) -> dict:
        """Q, K, V's specs in megatron's [s, b, heads, hn] layout."""
        return {"query": replace(self.qk.a, axis=-1, shard_dim=_HEADS),
                "key": replace(self.qk.b, axis=-1, shard_dim=_HEADS),
                "value": replace(self.pv.b, axis=0, shard_dim=_HEADS)}

    @property
    def quantizes(self) -> bool:
        """Some operand of either product (forward or backward) has a format."""
        return any(spec.fmt is not None for bmm in (self.qk, self.pv) for spec in vars(bmm).values())

    @property
    def fusable(self) -> bool:
        """SDPA can apply it: Q/K/V quantized before the kernel without per-tensor scales (SDPA
        takes no descaling factors here), P untouched."""
        qkv = [s.fmt for s in self.inputs.values() if s.fmt is not None]
        return self.pv.a.fmt is None and bool(qkv) and not any(f.needs_tensor_amax for f in qkv)

    @functools.cached_property
    def flash(self) -> Optional[TileFormats]:
        """The flash kernels' tile formats where they serve this recipe (the module docstring), else None;
        computed once (each call asks which path it takes)."""
        specs = [*vars(self.qk).values(), *vars(self.pv).values()]
        if any(s.fmt is not None and (s.fmt.needs_tensor_amax or s.stochastic) for s in specs):
            return None
        tiles = (self.pv.a.fmt, self.pv.grad_b_a.fmt, self.qk.grad_a_dc.fmt, self.qk.grad_b_dc.fmt)
        return None if all(f is None for f in tiles) else tile_formats(*tiles)


class _FusedAttention(torch.autograd.Function):
    """SDPA forward on quantized Q/K/V; backward by recomputing the unfused path on them."""

    @staticmethod
    def forward(ctx, query: Tensor, key: Tensor, value: Tensor, attn: "QuantDotProductAttention",
                attention_mask: Optional[Tensor], inputs: tuple, noise: Optional[NoiseScope]) -> Tensor:
        ctx.attn, ctx.attention_mask, ctx.inputs, ctx.noise = attn, attention_mask, inputs, noise
        ctx.save_for_backward(query, key, value)
        return attn._sdpa(*(x.values for x in inputs))

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        attn, mask, inputs, noise = ctx.attn, ctx.attention_mask, ctx.inputs, ctx.noise
        grads = recompute_backward(lambda q, k, v: attn._unfused(q, k, v, mask, inputs, noise),
                                   ctx.saved_tensors, grad_output)
        return grads + (None, None, None, None)


def _flash_kernels_run(query: Optional[Tensor]) -> bool:
    """The flash kernels run on ``query``'s device (None: the GPU if there is one), as the quantization
    kernels do (``CUSTOM_QUANT_KERNELS``): CUDA tensors with Triton under ``auto`` or ``triton``, CPU
    tensors only with ``triton`` under Triton's interpreter (tests)."""
    chosen = backend()
    if torch.cuda.is_available() if query is None else query.is_cuda:
        return chosen in ("auto", "triton") and triton_available()
    return chosen == "triton" and interpreting()


class _FlashAttention(torch.autograd.Function):
    """The flash kernels on quantized Q/K/V; the backward quantizes its GEMM operands as the unfused
    path's (``QuantBmmFunction``) and the kernels quantize P and dS."""

    @staticmethod
    def forward(ctx, query: Tensor, key: Tensor, value: Tensor, attn: "QuantDotProductAttention", inputs: tuple,
                noise: Optional[NoiseScope]) -> Tensor:
        from megatron.quant.kernels.flash_attention import flash_forward

        q, k, v = (x.values.contiguous() for x in inputs)
        ctx.attn, ctx.quant, ctx.noise = attn, attn.quant, noise  # the forward's recipe (a schedule may switch it)
        ctx.causal = attn.attn_mask_type == AttnMaskType.causal
        out, m, total = flash_forward(q, k, v, attn.softmax_scale, ctx.causal, attn.quant.flash.probs)
        ctx.save_for_backward(query, key, value, q, k, m, total)
        return out.view(out.shape[0], out.shape[1], attn.hidden_size_per_partition)

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        from megatron.quant.kernels.flash_attention_backward import flash_backward

        query, key, value, q, k, m, total = ctx.saved_tensors
        attn, quant = ctx.attn, ctx.quant
        grad = grad_output.reshape(query.shape)
        along_dims, along_tokens = -1, 0  # the head dimension; the sequence ([s, b, heads, d])
        wanted = {"value": (value, quant.pv.grad_a_b, along_dims),
                  "grad_output": (grad, quant.pv.grad_a_dc, along_dims),
                  "key_by_keys": (key, quant.qk.grad_a_b, along_tokens),
                  "query_by_queries": (query, quant.qk.grad_b_a, along_tokens),
                  "grad_output_by_queries": (grad, quant.pv.grad_b_dc, along_tokens)}
        operands = {name: quantize_operand(x.detach(), replace(spec, axis=axis, shard_dim=_HEADS), attn.tp_group,
                                           ctx.noise).values.contiguous() for name, (x, spec, axis) in wanted.items()}
        grads = flash_backward({"query": q, "key": k, **operands}, m, total, attn.softmax_scale, ctx.causal,
                               quant.flash)
        return grads + (None, None, None)


class QuantDotProductAttention(FinishesInit, Phased, DotProductAttention):
    """DotProductAttention with fake-quantized GEMM operands; stock until ``configure_quant``.

    ``allow_fused``: may run SDPA where it computes what the unfused path does (the module docstring).
    """

    PHASED = ("quant", "noise_root")  # what configure_quant sets per phase of a schedule
    quant: Optional[AttentionQuant] = None
    capture_site: Optional[CaptureSite] = None
    allow_fused: bool = True
    noise_root: Optional[RandomBits] = None

    def __init__(self, *args: Any, allow_fused: bool = True, k_channels: Optional[int] = None,
                 v_channels: Optional[int] = None, **kwargs: Any):
        """``k_channels``, ``v_channels``: the query/key and the value head sizes where they differ from
        the config's ``kv_channels``, as multi-latent attention gives them (megatron-core's own
        DotProductAttention takes neither; Transformer Engine's does). MLA passes its softmax scale."""
        if k_channels is not None and kwargs.get("softmax_scale") is None:
            kwargs["softmax_scale"] = 1.0 / math.sqrt(k_channels)  # as megatron-core's default
        super().__init__(*args, **kwargs)
        self.allow_fused = allow_fused
        if v_channels is not None:  # the context's width: heads x the value head size
            self.hidden_size_per_partition = v_channels * self.num_attention_heads_per_partition

    def finish_init(self, quantization_config: Optional[QuantizationConfig]) -> None:
        """Take the formats the config megatron-core matched to this module gives it (none matched: stock)."""
        if quantization_config is None:
            return
        quant = module_quant(quantization_config, self.config, "core_attention")
        self.configure_phases(lambda formats: self.configure_quant(
            AttentionQuant.from_formats(formats), quant.site, self.allow_fused, quant.seed),
            quant.phases, quant.phase_of)

    def configure_quant(self, quant: AttentionQuant, site: Optional[CaptureSite], allow_fused: bool = True,
                        seed: int = 0) -> None:
        """``seed`` and the module name (the site's) key its stochastic rounding; delayed-scaled
        operands get fresh amax histories (``amax_histories``, checkpointed)."""
        group = amax_reduction_group(self.tp_group, self.config.tp_only_amax_red)
        self.quant = attach_histories(quant, self, group)
        self.capture_site, self.allow_fused = site, allow_fused
        specs = [*vars(quant.qk).values(), *vars(quant.pv).values()]
        self.noise_root = module_noise_root(seed, site.module if site else "", specs)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: Optional[dict] = None):
        """megatron-core's (which holds no buffers) plus the amax histories, replicated over TP and DP."""
        state = super().sharded_state_dict(prefix, sharded_offsets, metadata)
        if HISTORIES in self._modules:
            buffers = self._modules[HISTORIES].state_dict(prefix=f"{HISTORIES}.", keep_vars=True)
            dp_cp_group = (metadata or {}).get("dp_cp_group")
            groups = {} if dp_cp_group is None else {"tp_group": self.tp_group, "dp_cp_group": dp_cp_group}
            state.update(make_sharded_tensors_for_checkpoint(buffers, prefix, {}, sharded_offsets, **groups))
        return state

    def path(self) -> str:
        """The path a causal self-attention call without an explicit mask takes (what training runs):
        ``sdpa``, ``sdpa-quantized``, ``flash-quantized`` or ``unfused`` (see the module docstring)."""
        return self._path(None, None, None)

    def _sdpa_case(self, query: Optional[Tensor], key: Optional[Tensor], attention_mask: Optional[Tensor]) -> bool:
        """SDPA (and the flash kernels) compute what the unfused path does: no dropout, causal or no mask."""
        return (self.allow_fused and (query is None or query.size(0) == key.size(0))
                and (self.attention_dropout.p == 0.0 or not self.training)
                and self.softmax_offset is None and self.scale_mask_softmax.scale is None
                and getattr(self.scale_mask_softmax, "window_size", None) is None
                and attention_mask is None and self.attn_mask_type in (AttnMaskType.causal, AttnMaskType.no_mask))

    def _flash_case(self, query: Optional[Tensor], key: Optional[Tensor], attention_mask: Optional[Tensor]) -> bool:
        """The flash kernels cover this call on any device (the module docstring)."""
        dims = self.config.kv_channels if query is None else query.size(-1)
        dtype = self.config.params_dtype if query is None else query.dtype
        return (self._sdpa_case(query, key, attention_mask) and not self.quant.fusable
                and self.quant.flash is not None and dtype in (torch.float32, torch.bfloat16)
                and (dtype == torch.float32 or self.scale_mask_softmax.softmax_in_fp32)  # the kernels' softmax: fp32
                and self.hidden_size_per_partition == self.num_attention_heads_per_partition * dims)

    def _path(self, query: Optional[Tensor], key: Optional[Tensor], attention_mask: Optional[Tensor]) -> str:
        sdpa = self._sdpa_case(query, key, attention_mask)
        if sdpa and not self.quant.quantizes:
            return "sdpa"
        if sdpa and self.quant.fusable:
            return "sdpa-quantized"
        if self._flash_case(query, key, attention_mask) and _flash_kernels_run(query):
            return "flash-quantized"
        return "unfused"

    def uses_fused_path(self, query: Tensor, key: Tensor, attention_mask: Optional[Tensor]) -> bool:
        """True when this call would take the SDPA path on quantized Q/K/V (see the module docstring)."""
        return self._path(query, key, attention_mask) == "sdpa-quantized"

    def forward(self, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
                attn_mask_type: Optional[AttnMaskType] = None, attention_bias: Optional[Tensor] = None,
                packed_seq_params=None) -> Tensor:
        self.enter_phase()
        if self.quant is None:
            return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias,
                                   packed_seq_params)
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError("QuantDotProductAttention supports neither packed sequences nor attention_bias "
                             "(as megatron-core's DotProductAttention)")
        site = self.capture_site
        capture = capturing(site)
        noise = noise_scope(self.noise_root, self.tp_group)
        inputs = self._quantize_inputs(query, key, value, noise, capture)
        if capture:
            tensor_saver.capture(site, "forward", "pre", {name: q.seen for name, q in zip(("query", "key", "value"),
                                                                                           inputs)})
            query, key, value = CaptureGradients.apply(site, "post", ("grad_query", "grad_key", "grad_value"),
                                                       query, key, value)
        path = self._path(query, key, attention_mask)
        if path == "sdpa":
            context = self._sdpa(query, key, value)
        elif path == "sdpa-quantized":
            context = _FusedAttention.apply(query, key, value, self, attention_mask, inputs, noise)
        elif path == "flash-quantized":
            context = _FlashAttention.apply(query, key, value, self, inputs, noise)
        else:
            context = self._unfused(query, key, value, attention_mask, inputs, noise)
        if capture:
            tensor_saver.capture(site, "forward", "post", {"output": context})
            (context,) = CaptureGradients.apply(site, "pre", ("grad_output",), context)
        return context

    def _quantize_inputs(self, query: Tensor, key: Tensor, value: Tensor, noise: Optional[NoiseScope],
                         capture: bool) -> tuple[Quantized, Quantized, Quantized]:
        """Q, K, V quantized once in [s, b, heads, hn] (detached: the GEMMs pass gradients straight
        through to the high-precision tensors)."""
        with torch.no_grad():
            return tuple(quantize_operand(x.detach(), spec, self.tp_group, noise, capture=capture)
                         for x, spec in zip((query, key, value), self.quant.inputs.values()))

    def _unfused(self, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
                 inputs: tuple[Quantized, Quantized, Quantized], noise: Optional[NoiseScope]) -> Tensor:
        """megatron-core's DotProductAttention.forward with the two products quantized."""
        q_in, k_in, v_in = inputs
        rep = self.num_attention_heads_per_partition // self.num_query_groups_per_partition
        if rep > 1:
            key, value = key.repeat_interleave(rep, dim=2), value.repeat_interleave(rep, dim=2)
            k_in = replace(k_in, values=k_in.values.repeat_interleave(rep, dim=2))
            v_in = replace(v_in, values=v_in.values.repeat_interleave(rep, dim=2))
        sq, b, heads, _ = query.shape
        sk = key.size(0)
        as_a = lambda t, s: t.reshape(s, b * heads, -1).transpose(0, 1)  # noqa: E731  [bn, s, hn]
        as_kt = lambda t: as_a(t, sk).transpose(1, 2)  # noqa: E731                   [bn, hn, sk]
        qk = BmmOperands(self.tp_group, noise, b, a=replace(q_in, values=as_a(q_in.values, sq)),
                         b=replace(k_in, values=as_kt(k_in.values)))
        scores = QuantBmmFunction.apply(as_a(query, sq), as_kt(key), self.softmax_scale, self.quant.qk, qk)
        if self._flash_case(query, key, attention_mask):  # the flash kernels' softmax, as they compute it
            probs = DefinedSoftmax.apply(scores.view(b, heads, sq, sk), self.attn_mask_type == AttnMaskType.causal)
        else:
            probs = self.scale_mask_softmax(scores.view(b, heads, sq, sk), attention_mask, self.softmax_offset)
        if not self.config.sequence_parallel:
            with tensor_parallel.get_cuda_rng_tracker().fork():
                probs = self.attention_dropout(probs)
        else:
            probs = self.attention_dropout(probs)
        pv = BmmOperands(self.tp_group, noise, b, b=replace(v_in, values=as_a(v_in.values, sk)))
        context = QuantBmmFunction.apply(probs.view(b * heads, sq, -1), as_a(value, sk), None, self.quant.pv, pv)
        context = context.view(b, heads, sq, -1).permute(2, 0, 1, 3).contiguous()
        return context.view(sq, b, self.hidden_size_per_partition)

    def _sdpa(self, query: Tensor, key: Tensor, value: Tensor) -> Tensor:
        # [s, b, heads, hn] -> [b, heads, s, hn]; GQA stays unexpanded (enable_gqa).
        q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=self.attn_mask_type == AttnMaskType.causal,
                                             scale=self.softmax_scale, enable_gqa=q.size(1) != k.size(1))
        sq, b = out.shape[2], out.shape[0]
        return out.permute(2, 0, 1, 3).reshape(sq, b, self.hidden_size_per_partition)
