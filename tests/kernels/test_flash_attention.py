"""The quantized flash attention kernels (``kernels.flash_attention``) against the unfused quantized path of
``QuantDotProductAttention``, under Triton's interpreter: output and Q, K, V gradients bit for bit, for the
formats the hifp8 and mxfp4 recipes give P and dS, causal and not, GQA 2:1. The shapes are small (48
tokens: a ragged query and key block; head size 32, whose softmax scale is not a power of two), so every
GEMM's float32 sum is exact and the summation order cannot show; mxfp4 also at 80 tokens (two query and key
blocks, the second ragged). The tests marked ``device`` run compiled on a GPU with ``pytest --device cuda -m
device`` (not run on one yet). Also: the shared softmax against an
independent one, which path a recipe takes, and the kernels' sm_90 build."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from megatron.core.transformer.enums import AttnMaskType

from megatron.quant.kernels.flash_attention_softmax import (
    KEY_BLOCK,
    DefinedSoftmax,
    defined_exp,
    row_stats,
    row_sum,
    softmax_forward,
)
from megatron.quant.layers.attention import AttentionQuant, QuantDotProductAttention
from megatron.quant.recipes.recipe import QuantRecipe
from megatron.quant.tensor_saver import CaptureSite
from tests.layers._helpers import transformer_config

SEQ, BATCH, HEADS, GROUPS, HEAD_DIM = 48, 1, 2, 1, 32
SITE = CaptureSite("attention", "FA", 0, "test.core_attention", "core_attention", "test")


@pytest.fixture(scope="module")
def parallel():
    from megatron.quant import cpu

    cpu.init_parallel(seed=11)
    yield
    cpu.destroy_parallel()


def _attention(recipe: str, causal: bool, dtype=torch.float32, softmax_in_fp32=True, **options
               ) -> QuantDotProductAttention:
    config = transformer_config(hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS, num_query_groups=GROUPS,
                                params_dtype=dtype, bf16=dtype == torch.bfloat16,
                                attention_softmax_in_fp32=softmax_in_fp32)
    module = QuantDotProductAttention(config, layer_number=1, attention_type="self",
                                      attn_mask_type=AttnMaskType.causal if causal else AttnMaskType.no_mask)
    formats = QuantRecipe.uniform(recipe, **options).resolve("core_attention", 0, 1)
    module.configure_quant(AttentionQuant.from_formats(formats), SITE)
    return module


def _run(module, dtype, seed=0, seq=SEQ, device="cpu", batch=BATCH):
    g = torch.Generator().manual_seed(seed)
    leaves = [torch.randn(seq, batch, h, HEAD_DIM, generator=g).to(device, dtype).requires_grad_()
              for h in (HEADS, GROUPS, GROUPS)]
    out = module(*leaves, attention_mask=None)
    out.backward(torch.randn(out.shape, generator=g).to(device, dtype))
    return [out.detach()] + [t.grad for t in leaves]


def _flash_and_unfused(module, monkeypatch, device, dtype=torch.float32, seed=0, seq=SEQ, batch=BATCH):
    q = torch.zeros(seq, batch, HEADS, HEAD_DIM, dtype=dtype, device=device)
    monkeypatch.setenv("CUSTOM_QUANT_KERNELS", "triton")  # CPU tensors too: the kernels under the interpreter
    assert module._path(q, q, None) == "flash-quantized"
    flash = _run(module, dtype, seed, seq, device, batch)
    monkeypatch.setenv("CUSTOM_QUANT_KERNELS", "torch")  # the unfused path
    assert module._path(q, q, None) == "unfused"
    unfused = _run(module, dtype, seed, seq, device, batch)
    assert all(t.abs().max() > 0 for t in unfused)
    return dict(zip(("output", "grad query", "grad key", "grad value"), zip(flash, unfused)))


@pytest.mark.device
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "no-mask"])
def test_mxfp4_flash_attention_equals_the_unfused_path_bit_for_bit(parallel, monkeypatch, kernel_device, causal):
    results = _flash_and_unfused(_attention("mxfp4", causal), monkeypatch, kernel_device, seq=80)
    for name, (flash, unfused) in results.items():
        assert torch.equal(flash, unfused), f"{name}: {(flash - unfused).abs().max()}"


@pytest.mark.device
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "no-mask"])
def test_hifp8_flash_attention_equals_the_unfused_path_but_for_inexact_gradient_sums(parallel, monkeypatch,
                                                                                     kernel_device, causal):
    """HiF8's tapered grid keeps dS values down to 2**-22: dQ = dS K and dK = dS^T Q add products more than 24
    bits apart, whose float32 sum depends on the order (numpy's GEMM in the interpreter, torch's in the unfused
    path): a few elements of 1536 or 3072 differ, by an ulp or so. O, dV and the rest are the same bits."""
    results = _flash_and_unfused(_attention("hifp8", causal), monkeypatch, kernel_device, seed=3 if causal else 0)
    for name in ("output", "grad value"):
        assert torch.equal(*results[name]), name
    for name in ("grad query", "grad key"):
        flash, unfused = results[name]
        assert (flash != unfused).sum() <= 4, name
        torch.testing.assert_close(flash, unfused, rtol=0, atol=2.0 ** -22 * unfused.abs().max().item(), msg=name)


@pytest.mark.device
def test_flash_attention_in_bf16_equals_the_unfused_path(parallel, monkeypatch, kernel_device):
    """bf16 inputs: the scores, P, dP, dS and the results rounded to bf16 where the unfused path's are; a
    batch of two (the kernels' batch strides)."""
    results = _flash_and_unfused(_attention("mxfp4", True, torch.bfloat16), monkeypatch, kernel_device,
                                 torch.bfloat16, seed=1, batch=2)
    for name, (flash, unfused) in results.items():
        assert torch.equal(flash, unfused), f"{name}: {(flash - unfused).abs().max()}"


def test_recipes_the_kernels_do_not_cover_keep_the_unfused_path(parallel, monkeypatch):
    q = torch.zeros(SEQ, BATCH, HEADS, HEAD_DIM)
    assert _attention("mxfp8", True)._path(q, q, None) == "unfused"  # CPU tensors, the default kernels: torch
    monkeypatch.setenv("CUSTOM_QUANT_KERNELS", "triton")
    assert _attention("mxfp4", True, rounding="stochastic")._path(q, q, None) == "unfused"  # SR
    assert _attention("nvfp4", True)._path(q, q, None) == "unfused"  # a per-tensor scale
    assert _attention("mxfp8", True)._path(q, q, torch.zeros(1, 1, SEQ, SEQ, dtype=torch.bool)) == "unfused"
    assert _attention("mxfp8", True)._path(q, q, None) == "flash-quantized"
    bf16 = q.to(torch.bfloat16)
    assert _attention("mxfp8", True, torch.bfloat16)._path(bf16, bf16, None) == "flash-quantized"
    assert _attention("mxfp8", True, torch.bfloat16, softmax_in_fp32=False)._path(bf16, bf16, None) == "unfused"


def test_a_gpu_run_names_the_flash_path_on_its_start_line(parallel, monkeypatch):
    from megatron.quant.layers import attention, fusions

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(attention, "triton_available", lambda: True)
    model = torch.nn.ModuleList([_attention("mxfp4", True), _attention("mxfp4", True, rounding="stochastic")])
    assert [m.path() for m in model] == ["flash-quantized", "unfused"]
    paths = fusions.FastPaths("auto", sdpa=True, compiled=False, cross_entropy=False)
    assert paths.describe(model).startswith("fusions auto: attention=flash-quantized x1, unfused x1,")
    monkeypatch.setenv("CUSTOM_QUANT_KERNELS", "torch")  # the reference everywhere
    assert model[0].path() == "unfused"


def test_the_shared_exp_is_within_two_ulps_of_exp():
    x = torch.linspace(-87.0, 0.0, 200_001)
    exact = torch.exp(x.double())
    ulp = torch.ldexp(torch.ones_like(exact), torch.frexp(exact.float())[1].long() - 24)
    assert ((defined_exp(x).double() - exact).abs() / ulp).max() <= 2.0
    assert defined_exp(torch.tensor([float("-inf"), -200.0])).tolist() == [0.0, 0.0]


def test_the_row_sum_folds_each_key_block_pairwise_then_adds_the_blocks_in_order():
    t = torch.rand(3, 2 * KEY_BLOCK + 5)
    blocks = torch.nn.functional.pad(t, (0, 3 * KEY_BLOCK - t.shape[-1])).view(3, 3, KEY_BLOCK)
    while blocks.shape[-1] > 1:  # an independent loop over the pairs
        half = blocks.shape[-1] // 2
        blocks = torch.stack([blocks[..., i] + blocks[..., i + half] for i in range(half)], dim=-1)
    expected = (blocks[:, 0] + blocks[:, 1]) + blocks[:, 2]
    assert torch.equal(row_sum(t), expected)


def test_the_row_statistics_are_the_max_and_the_sum_of_exp_within_a_few_ulps():
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(3, 2 * KEY_BLOCK + 7, generator=g).mul(6.0)
    scores[0, :KEY_BLOCK] -= 30.0  # the max arrives in a later block: the sum is rescaled
    m, total = row_stats(scores)
    assert torch.equal(m, scores.amax(-1, keepdim=True))
    exact = torch.exp(scores.double() - m.double()).sum(-1, keepdim=True)
    torch.testing.assert_close(total.double(), exact, rtol=1e-6, atol=0)


def test_the_shared_softmax_is_within_a_few_ulps_of_torch_softmax():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(4, 2, 40, 40, generator=g).mul(4.0).requires_grad_()
    mask = torch.ones(40, 40, dtype=torch.bool).triu(1)
    probs = DefinedSoftmax.apply(scores, True)
    reference = torch.softmax(scores.detach().masked_fill(mask, float("-inf")), -1)
    assert torch.equal(probs.detach(), softmax_forward(scores.detach(), mask))
    torch.testing.assert_close(probs.detach(), reference, rtol=4e-7, atol=1e-12)  # a few float32 ulps
    assert not torch.equal(probs.detach(), reference)  # torch's exp and sum order differ from the shared ones
    grad = torch.randn(probs.shape, generator=g)
    (mine,) = torch.autograd.grad(probs, scores, grad)
    wanted = torch.autograd.grad(torch.softmax(scores.masked_fill(mask, float("-inf")), -1), scores, grad)[0]
    torch.testing.assert_close(mine, wanted, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("triton_version", ["installed", "oldest"])
def test_the_kernels_build_for_sm90(triton_version):
    """The interpreter does not type-check a kernel as the GPU compiler does: each kernel, in an elementwise
    and two MX cases, float32 and bf16 dots, is lowered to Triton IR for sm_90 in a process of its own, with the
    installed Triton and with the oldest supported (3.6, stricter; MEGATRON_QUANT_TRITON_OLDEST names a folder
    holding it, as in test_gpu_build.py)."""
    pytest.importorskip("triton.backends.nvidia.compiler", reason="Triton without its NVIDIA backend")
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    paths = [str(root), env.get("PYTHONPATH", "")]
    if triton_version == "oldest":
        if not env.get("MEGATRON_QUANT_TRITON_OLDEST"):
            pytest.skip("MEGATRON_QUANT_TRITON_OLDEST names no Triton 3.6 install")
        paths.insert(0, env["MEGATRON_QUANT_TRITON_OLDEST"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    run = subprocess.run([sys.executable, "-m", "tests.kernels._flash_build"], cwd=root, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert run.stdout.count("built ") == 9 and "0 failed" in run.stdout
