"""layers/fusions.py: what CUSTOM_QUANT_FUSIONS chooses, and each fast path against the plain path it
replaces (megatron-core's unfused operations). The compiled regions run eagerly here (dynamo
disabled: the same Python, the tests stay cheap)."""
import pytest
import torch
from megatron.core import parallel_state, tensor_parallel
from megatron.core.fusions.fused_cross_entropy import fused_vocab_parallel_cross_entropy
from megatron.core.models.common.embeddings import rope_utils
from megatron.core.transformer import mlp

from megatron.quant.layers import fusions
from megatron.quant.layers.spec import build_llama_model
from megatron.quant.recipes.recipe import QuantRecipe
from tests.layers._helpers import transformer_config

VOCAB, SEQ, BATCH = 128, 32, 2


def test_auto_fuses_attention_everywhere_and_compiles_on_cuda_only():
    cpu = fusions.choose({}, cuda=False, precision="bf16")
    assert (cpu.sdpa, cpu.compiled, cpu.cross_entropy) == (True, False, False)
    gpu = fusions.choose({"CUSTOM_QUANT_FUSIONS": "auto"}, cuda=True, precision="bf16")
    assert (gpu.sdpa, gpu.compiled, gpu.cross_entropy) == (True, True, True)
    # megatron-core's fused cross entropy returns bf16 gradients: not for fp32 logits
    assert not fusions.choose({}, cuda=True, precision="fp32").cross_entropy
    off = fusions.choose({"CUSTOM_QUANT_FUSIONS": "off"}, cuda=True, precision="bf16")
    assert (off.sdpa, off.compiled, off.cross_entropy) == (False, False, False)
    assert off.config_flags() == {"bias_activation_fusion": False, "apply_rope_fusion": False,
                                  "cross_entropy_loss_fusion": False, "cross_entropy_fusion_impl": "native"}
    with pytest.raises(ValueError, match=r"CUSTOM_QUANT_FUSIONS='fast' is not one of auto, off"):
        fusions.choose({"CUSTOM_QUANT_FUSIONS": "fast"}, cuda=False, precision="bf16")


def _loss_and_grads(model):
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    loss = model(tokens, torch.arange(SEQ).expand(BATCH, SEQ), None, labels=tokens).float().mean()
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def _model(paths):
    torch.manual_seed(0)
    return build_llama_model(transformer_config(**paths.config_flags()), QuantRecipe.uniform("bf16"),
                             vocab_size=VOCAB, max_sequence_length=SEQ, sdpa=paths.sdpa)


def _counting(monkeypatch, owner, name):
    calls = []
    original = getattr(owner, name)
    monkeypatch.setattr(owner, name, lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs))
    return calls


def test_fused_model_computes_what_the_unfused_model_computes(parallel, monkeypatch):
    fast = fusions.FastPaths("auto", sdpa=True, compiled=True, cross_entropy=False)  # fp32: no fused CE
    plain = fusions.FastPaths("off", sdpa=False, compiled=False, cross_entropy=False)
    swiglu = _counting(monkeypatch, mlp, "bias_swiglu_impl")
    fused = _model(fast)
    with torch._dynamo.config.patch(disable=True):
        loss_f, grads_f = _loss_and_grads(fused)
    loss_p, grads_p = _loss_and_grads(_model(plain))
    assert len(swiglu) == 2  # per layer: one SwiGLU
    assert fast.describe(fused) == ("fusions auto: attention=sdpa, rmsnorm=torch, swiglu=compiled, rope=eager, "
                                    "cross-entropy=eager")
    torch.testing.assert_close(loss_f, loss_p, rtol=1e-6, atol=0)
    for name in grads_p:  # SDPA's and SwiGLU's hand-written backward round differently
        torch.testing.assert_close(grads_f[name], grads_p[name], rtol=1e-4, atol=1e-6, msg=name)


def test_fast_paths_leave_megatron_core_s_rope_kernel_alone(monkeypatch):
    """Nothing of megatron-core is replaced for the process: without Transformer Engine's kernel RoPE
    stays eager (apply_rope_fusion off), with it megatron-core's own fusion runs TE's kernel."""
    fast = fusions.FastPaths("auto", sdpa=True, compiled=True, cross_entropy=True)
    kernel = rope_utils.fused_apply_rotary_pos_emb
    assert fast.config_flags()["apply_rope_fusion"] is (kernel is not None)
    assert rope_utils.fused_apply_rotary_pos_emb is kernel
    te_kernel = object()
    monkeypatch.setattr(rope_utils, "fused_apply_rotary_pos_emb", te_kernel)
    assert fast.config_flags()["apply_rope_fusion"] is True
    assert rope_utils.fused_apply_rotary_pos_emb is te_kernel


def test_fused_cross_entropy_equals_megatron_s_vocab_parallel_one(parallel):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(SEQ, BATCH, VOCAB, generator=g).mul(4).bfloat16()
    labels = torch.randint(0, VOCAB, (SEQ, BATCH), generator=g)
    grad = torch.randn(SEQ, BATCH, generator=g)
    results = []
    with torch._dynamo.config.patch(disable=True):
        group = parallel_state.get_tensor_model_parallel_group()
        for loss_fn in (lambda x: fused_vocab_parallel_cross_entropy(x, labels, group),
                        lambda x: tensor_parallel.vocab_parallel_cross_entropy(x, labels)):
            leaf = logits.clone().requires_grad_()
            loss = loss_fn(leaf)
            loss.backward(grad)
            results.append((loss.detach(), leaf.grad))
    (loss_f, grad_f), (loss_p, grad_p) = results
    torch.testing.assert_close(loss_f, loss_p, rtol=1e-6, atol=1e-6)
    assert grad_f.dtype == grad_p.dtype == torch.bfloat16
    torch.testing.assert_close(grad_f, grad_p, rtol=0, atol=0)  # the same formula, rounded once to bf16


def test_rmsnorm_is_torch_s_whose_cuda_kernel_is_fused(parallel):
    model = _model(fusions.FastPaths("auto", sdpa=True, compiled=False, cross_entropy=False))
    norm = model.decoder.layers[0].input_layernorm
    assert type(norm) is torch.nn.RMSNorm  # F.rms_norm: torch's fused kernel on CUDA
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        x = torch.randn(SEQ, BATCH, norm.weight.numel(), generator=torch.Generator().manual_seed(3))
        plain = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + norm.eps) * norm.weight
        torch.testing.assert_close(norm(x), plain, rtol=1e-6, atol=1e-6)
