"""The fast paths of the work nothing quantizes, chosen in one place: ``CUSTOM_QUANT_FUSIONS``.

A Megatron-LM bf16 baseline runs Transformer Engine's fused attention and kernels; without TE or
Apex, megatron-core's local spec runs them as chains of eager torch operations. ``auto`` (the
default) chooses instead:

- attention that nothing quantizes: ``F.scaled_dot_product_attention`` (flash / cuDNN on a GPU),
  on every device, where SDPA reproduces megatron-core's mask and dropout (``layers/attention.py``);
- SwiGLU: megatron-core's ``bias_swiglu`` fusion (``bias_activation_fusion``; ``torch.compile``), CUDA;
- RoPE: megatron-core's ``apply_rope_fusion`` where Transformer Engine provides its kernel, CUDA;
  without TE, eager: megatron-core offers no seam for another kernel, and replacing its module's
  function would change every model in the process (docs/design.md);
- the vocab-parallel cross entropy: megatron-core's native fusion (``cross_entropy_loss_fusion``;
  ``torch.compile``), CUDA with bf16 logits only: it returns bf16 gradients;
- RMSNorm: nothing to choose, megatron-core's ``WrappedTorchNorm`` is ``torch.nn.RMSNorm``, whose
  ``F.rms_norm`` is torch's fused kernel on CUDA.

``off``: megatron-core's exact unfused operations everywhere, the reference the fast paths are
tested against (``tests/layers/test_fusions.py``). Each fast path computes what its plain path
computes, up to rounding (the summation order changes); the tests state the tolerances.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Mapping, Optional

import torch
from megatron.core.models.common.embeddings import rope_utils

from megatron.quant.formats.show import show_value
from megatron.quant.layers.attention import QuantDotProductAttention
from megatron.quant.settings.environment import settings_of
from megatron.quant.settings.variables import FUSIONS_ENV

ENV = FUSIONS_ENV
CHOICES = ("auto", "off")


@dataclass(frozen=True)
class FastPaths:
    """What ``CUSTOM_QUANT_FUSIONS`` chose for this run."""

    choice: str              # "auto" | "off"
    sdpa: bool               # attention nothing quantizes runs SDPA (and quantized Q/K/V the fused path)
    compiled: bool           # SwiGLU through its compiled fusion, RoPE through TE's kernel where installed
    cross_entropy: bool      # megatron-core's fused cross entropy

    @property
    def rope(self) -> bool:
        """RoPE through ``apply_rope_fusion``: only with the kernel Transformer Engine gives megatron-core."""
        return self.compiled and rope_utils.fused_apply_rotary_pos_emb is not None

    def config_flags(self) -> dict:
        """The TransformerConfig fields that select the fusions."""
        return {"bias_activation_fusion": self.compiled, "apply_rope_fusion": self.rope,
                "cross_entropy_loss_fusion": self.cross_entropy, "cross_entropy_fusion_impl": "native"}

    def describe(self, model: torch.nn.Module) -> str:
        """The start line's words, e.g. ``fusions auto: attention=sdpa, rmsnorm=torch, swiglu=compiled, ...``;
        attention as each QuantDotProductAttention of ``model`` will run (counted when they differ)."""
        paths = Counter(m.path() for m in model.modules() if isinstance(m, QuantDotProductAttention)
                        and m.quant is not None)
        attention = ", ".join(p if len(paths) == 1 else f"{p} x{n}" for p, n in sorted(paths.items())) or "stock"
        fused = lambda on: "compiled" if on else "eager"  # noqa: E731
        return (f"fusions {self.choice}: attention={attention}, rmsnorm=torch, swiglu={fused(self.compiled)}, "
                f"rope={'te' if self.rope else 'eager'}, cross-entropy={fused(self.cross_entropy)}")


def choose(environ: Optional[Mapping[str, str]] = None, *, cuda: bool, precision: str) -> FastPaths:
    """The fast paths ``CUSTOM_QUANT_FUSIONS`` (``auto`` when unset) gives a run on ``cuda`` or CPU
    in ``precision`` (bf16, fp16, fp32); ValueError names a bad value and the allowed ones."""
    env = settings_of(environ)
    value = env.get(ENV, "").strip().lower() or "auto"
    if value not in CHOICES:
        raise ValueError(f"{ENV}={show_value(env[ENV])} is not one of {', '.join(CHOICES)}")
    auto = value == "auto"
    compiled = auto and cuda  # torch.compile on CPU costs more compile time than the tiny runs there save
    return FastPaths(choice=value, sdpa=auto, compiled=compiled, cross_entropy=compiled and precision == "bf16")
