"""megatron-core's multi-latent attention (MLA, DeepSeek-V3) with quantized projections.

``MLASelfAttention`` accepts only megatron-core's own classes for its two down projections (it
compares ``submodules.linear_q_down_proj`` and ``linear_kv_down_proj`` with a list of classes, so a
subclass is refused). ``QuantMLASelfAttention`` lets megatron-core build them as its stock
``ColumnParallelLinear`` and then makes each our quantized layer in place (``linear.quantize_built``),
with the role the MLA adapter names (``adapters.ADAPTERS``): the same object, weight and
initialisation, configured by ``finish_init`` as every other quantized module. Its other projections
and its core attention come from the spec like any layer's; core attention takes MLA's separate
query/key and value head sizes (``QuantDotProductAttention``'s ``k_channels``, ``v_channels``).

megatron-core 0.16 cannot build MLA without Transformer Engine: ``MultiLatentAttention.__init__``
asks ``isinstance(self.linear_proj, TELinear)`` where 0.16's ``TELinear`` is a stand-in object when
Transformer Engine is not installed, which raises TypeError. ``build_problem`` says so in one line
before anything is built; 0.19 checks for Transformer Engine first and builds MLA without it.
"""
from __future__ import annotations

from typing import Any, Optional

from megatron.core.transformer import multi_latent_attention
from megatron.core.transformer.multi_latent_attention import MLASelfAttention

from megatron.quant.layers.adapters import ADAPTER_BY_SUBMODULES
from megatron.quant.layers.linear import quantize_built

MLA = ADAPTER_BY_SUBMODULES[multi_latent_attention.MLASelfAttentionSubmodules]


def build_problem() -> Optional[str]:
    """Why the installed megatron-core cannot build multi-latent attention here (one line); None when it can."""
    if multi_latent_attention.HAVE_TE and not isinstance(multi_latent_attention.TELinear, type):
        return ("multi-latent attention needs Transformer Engine with megatron-core 0.16 (its MLA asks whether "
                "linear_proj is a TELinear, which 0.16 cannot answer without Transformer Engine); install "
                "Transformer Engine or megatron-core 0.19, or use GQA attention (multi_latent_attention=False)")
    return None


class QuantMLASelfAttention(MLASelfAttention):
    """MLASelfAttention whose down projections megatron-core builds stock are made quantized once built."""

    def __init__(self, *args: Any, **kwargs: Any):
        problem = build_problem()
        if problem:
            raise ValueError(problem)
        super().__init__(*args, **kwargs)
        built = dict(self.named_children())
        for field in sorted(MLA.built_stock):
            if field in built:  # linear_q_down_proj only with a query latent (q_lora_rank)
                quantize_built(built[field], MLA.roles[field])
