"""The Hopper FP8 GEMM accumulation model (``formats.accumulation``) against ``mmaemu`` (an independent
emulator of ``torch._scaled_mm`` and Transformer Engine's FP8 GEMMs as an H100 computes them), bit for
bit: fast and promoted accumulation, E4M3 x E4M3 and E4M3 x E5M2, FP32 and BF16 outputs, K from 16 to
16384 (ragged too), zeros, subnormals, saturating and heavy-tailed values, and a shape that mmaemu's
measured split-K table splits (the split it records, for the ``hopper`` and ``hopper-te`` profiles)."""
import warnings

import pytest
import torch

from megatron.quant.formats.accumulation import Operands, hopper_accumulate, hopper_epilogue

mmaemu = pytest.importorskip("mmaemu", reason="the oracle: pip install mmaemu (the test extra)")

DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def fp8(shape, kind: str, data: str, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    if data == "heavy":
        x = x * torch.exp(3 * torch.randn(shape, generator=g))
    elif data == "edges":  # zeros, subnormals and the format's largest values, mixed with normal ones
        pick = torch.randint(0, 4, shape, generator=g)
        smallest = {"e4m3": 2.0 ** -9, "e5m2": 2.0 ** -16}[kind]
        largest = torch.finfo(DTYPES[kind]).max
        x = torch.where(pick == 0, 0.0, x)
        x = torch.where(pick == 1, x.sign() * smallest * torch.randint(1, 7, shape, generator=g), x)
        x = torch.where(pick == 2, x.sign() * largest, x)
    largest = torch.finfo(DTYPES[kind]).max
    return x.clamp(-largest, largest).to(DTYPES[kind])


def oracle(a, b, fast: bool, out_dtype, scale_a, scale_b, profile: str, splits: int):
    """mmaemu's accumulator (any K) and ``torch._scaled_mm``'s epilogue (``mmaemu.model.epilogue``)."""
    from mmaemu.model.epilogue import apply

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        acc = mmaemu.accumulate(a, b, use_fast_accum=fast, profile=profile, backend="reference",
                                splitk=1 if splits == 1 else (splits, "contiguous"), out_dtype_for_split=out_dtype)
    return apply(acc, scale_a, scale_b, out_dtype=out_dtype)


def split_of(m, n, k, kinds, out_dtype, fast, profile) -> int:
    """The split mmaemu's table records for the shape, or 1 where it records none (the model's own
    decision: it never splits unless told)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return mmaemu.resolve_splitk(m, n, k, a_dtype=DTYPES[kinds[0]], b_dtype=DTYPES[kinds[1]],
                                         out_dtype=out_dtype, use_fast_accum=fast, profile=profile).S
        except mmaemu.SplitKUnknownError:
            return 1


def check(m, n, k, kinds, data, fast, out_dtype, profile="hopper", seed=0, compiled=None):
    a, b = fp8((m, k), kinds[0], data, seed), fp8((n, k), kinds[1], data, seed + 1)
    scale_a, scale_b = torch.tensor([0.37]), torch.tensor([1.9])
    splits = split_of(m, n, k, kinds, out_dtype, fast, profile)
    expected = oracle(a, b, fast, out_dtype, scale_a, scale_b, profile, splits)
    acc = hopper_accumulate(Operands(a.float(), b.float(), *kinds), fast, splits, compiled)
    ours = hopper_epilogue(acc, scale_a * scale_b, out_dtype)
    assert torch.equal(ours.view(torch.int16 if out_dtype == torch.bfloat16 else torch.int32),
                       expected.view(torch.int16 if out_dtype == torch.bfloat16 else torch.int32)), \
        f"{(ours != expected).sum().item()} of {ours.numel()} outputs differ (splits {splits})"
    return splits


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "promoted"])
@pytest.mark.parametrize("kinds", [("e4m3", "e4m3"), ("e4m3", "e5m2")], ids=["e4m3xe4m3", "e4m3xe5m2"])
@pytest.mark.parametrize("k, data", [(16, "normal"), (48, "edges"), (200, "heavy"), (1000, "edges"),
                                     (4096, "normal"), (16384, "heavy")])
def test_matches_mmaemu(fast, kinds, k, data):
    for out_dtype in (torch.float32, torch.bfloat16):
        check(3, 5, k, kinds, data, fast, out_dtype)


@pytest.mark.parametrize("profile", ["hopper", "hopper-te"])
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "promoted"])
def test_matches_mmaemu_where_its_table_splits_k(profile, fast):
    """M 16, N 64, K 5760: cuBLAS splits K in two on the H100 (mmaemu's measured table)."""
    assert check(16, 64, 5760, ("e4m3", "e4m3"), "normal", fast, torch.bfloat16, profile) == 2


@pytest.mark.slow  # compiles the block step (inductor: 10 to 30 s where its cache is cold), no training
@pytest.mark.parametrize("fast", [True, False], ids=["fast", "promoted"])
def test_compiled_block_step_matches_mmaemu(fast):
    """The block step under torch.compile (a large GEMM on the CPU) gives mmaemu's bits too: ragged K,
    zeros, subnormals, the largest values (one shape: each shape torch.compile specializes costs seconds)."""
    check(6, 5, 1000, ("e4m3", "e5m2"), "edges", fast, torch.float32, compiled=True)


def test_the_model_runs_eager_where_torch_cannot_compile(monkeypatch):
    """No C++ compiler (or a broken one): the block step runs eager, same bits, and says so once."""
    from megatron.quant.formats import accumulation

    def failing(*args, **kwargs):
        def call(*call_args):
            raise RuntimeError("InvalidCxxCompiler: no working C++ compiler found")
        return call

    monkeypatch.setattr(torch, "compile", failing)
    accumulation._compiled_step.cache_clear()
    try:
        with pytest.warns(UserWarning, match="runs eager.*no working C"):
            check(3, 5, 100, ("e4m3", "e4m3"), "edges", True, torch.float32, compiled=True)
    finally:
        accumulation._compiled_step.cache_clear()


def test_fast_accumulation_loses_what_promotion_keeps():
    """Long K with one large product first: the short accumulator drops the small ones after it."""
    k = 4096
    a = torch.full((1, k), 0.0625)
    b = torch.full((1, k), 0.0625)
    a[0, 0], b[0, 0] = 448.0, 448.0
    fast = hopper_accumulate(Operands(a, b), fast=True)
    promoted = hopper_accumulate(Operands(a, b), fast=False)
    exact = a.double() @ b.double().t()
    assert (exact - promoted.double()).abs() < (exact - fast.double()).abs()
