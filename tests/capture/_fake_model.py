"""A tiny model whose GEMMs call the saver exactly as the quantized layers do (interfaces.md §2).

Stands in for megatron.quant.layers (linear_function, bmm_function) in the capture tests: linear layers capture
input/weight/output forward and grad_output/weight/grad_input/grad_weight backward; an attention core captures
query/key/value/output forward and grad_output/grad_query/grad_key/grad_value backward.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from megatron.quant import position, tensor_saver
from megatron.quant.tensor_saver import CaptureSite, Operand

LINEAR_TENSORS = ("input", "weight", "output", "grad_output", "grad_input", "grad_weight")
ATTENTION_TENSORS = ("query", "key", "value", "output", "grad_output", "grad_query", "grad_key", "grad_value")


def _operand(tensor, fmt, axis):
    return Operand(tensor, fmt, axis) if fmt is not None else tensor


class CapturedLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, site: CaptureSite, fmt):
        if tensor_saver.is_active():
            tensor_saver.capture(site, "forward", "pre", {"input": _operand(x, fmt, -1),
                                                          "weight": _operand(weight, fmt, -1)})
        y = x @ weight.t()
        if tensor_saver.is_active():
            tensor_saver.capture(site, "forward", "post", {"output": y})
        ctx.save_for_backward(x, weight)
        ctx.site, ctx.fmt = site, fmt
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        if tensor_saver.is_active():
            tensor_saver.capture(ctx.site, "backward", "pre", {"grad_output": _operand(grad_y, ctx.fmt, -1),
                                                               "weight": _operand(weight, ctx.fmt, 0)})
        grad_x = grad_y @ weight
        grad_w = grad_y.reshape(-1, grad_y.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
        if tensor_saver.is_active():
            tensor_saver.capture(ctx.site, "backward", "post", {"grad_input": grad_x, "grad_weight": grad_w})
        return grad_x, grad_w, None, None


def _attention(q, k, v):
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    return torch.softmax(scores, dim=-1) @ v


class CapturedAttentionFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, site: CaptureSite):
        if tensor_saver.is_active():
            tensor_saver.capture(site, "forward", "pre", {"query": q, "key": k, "value": v})
        out = _attention(q, k, v)
        if tensor_saver.is_active():
            tensor_saver.capture(site, "forward", "post", {"output": out})
        ctx.save_for_backward(q, k, v)
        ctx.site = site
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v = (t.detach().requires_grad_() for t in ctx.saved_tensors)
        if tensor_saver.is_active():
            tensor_saver.capture(ctx.site, "backward", "pre", {"grad_output": grad_out})
        with torch.enable_grad():
            grads = torch.autograd.grad(_attention(q, k, v), (q, k, v), grad_out)
        if tensor_saver.is_active():
            names = ("grad_query", "grad_key", "grad_value")
            tensor_saver.capture(ctx.site, "backward", "post", dict(zip(names, grads)))
        return (*grads, None)


class FakeLayer(nn.Module):
    """qkv projection, attention core and output projection of one transformer layer."""

    def __init__(self, idx: int, hidden: int, quant_type: str, fmt=None):
        super().__init__()
        prefix = f"decoder.layers.{idx}.self_attention"
        self.fmt = fmt
        self.qkv = nn.Parameter(torch.randn(3 * hidden, hidden) / hidden ** 0.5)
        self.proj = nn.Parameter(torch.randn(hidden, hidden) / hidden ** 0.5)
        self.qkv_site = CaptureSite("linear", "linear", idx, f"{prefix}.linear_qkv", "qkv", quant_type)
        self.core_site = CaptureSite("attention", "FA", idx, f"{prefix}.core_attention", "core_attention", quant_type)
        self.proj_site = CaptureSite("linear", "linear", idx, f"{prefix}.linear_proj", "proj", quant_type)

    def forward(self, x):
        q, k, v = CapturedLinearFn.apply(x, self.qkv, self.qkv_site, self.fmt).chunk(3, dim=-1)
        return x + CapturedLinearFn.apply(CapturedAttentionFn.apply(q, k, v, self.core_site), self.proj,
                                          self.proj_site, self.fmt)


class FakeModel(nn.Module):
    def __init__(self, n_layers: int = 2, hidden: int = 8, quant_type: str = "bf16", fmt=None, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.layers = nn.ModuleList(FakeLayer(i, hidden, quant_type, fmt) for i in range(n_layers))
        self.hidden = hidden

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


# Captures per micro-batch and layer: two linears (weight is captured forward and backward)
# and one attention core.
CAPTURES_PER_LAYER = 2 * (len(LINEAR_TENSORS) + 1) + len(ATTENTION_TENSORS)


def run_iteration(model: FakeModel, iteration: int, n_microbatches: int = 2, batch: int = 2,
                  seq: int = 4, inputs: Optional[list] = None) -> list[torch.Tensor]:
    """One training iteration as the loop drives it: set_iteration, then per micro-batch fwd+bwd."""
    position.set_iteration(iteration)
    used = []
    for mb in range(n_microbatches):
        position.set_microbatch(mb, (iteration * n_microbatches + mb) * batch)
        x = inputs[mb] if inputs is not None else torch.randn(batch, seq, model.hidden)
        used.append(x)
        model(x).square().mean().backward()
    return used
