"""Elementwise formats in Triton against the torch path, bit for bit: bf16/fp16 casts, FP8 E4M3/E5M2
and HiF8, unscaled, per-tensor current and delayed scaling (TE's arithmetic), overflow rules,
round to nearest and stochastic (the keyed hash in the kernel, TP shards included)."""
import pytest
import torch

from megatron.quant.formats import get_format
from megatron.quant.formats.random_bits import RandomBits, Shard
from tests.kernels._compare import assert_same_result, triton_twin, wide_values

pytestmark = pytest.mark.device

CASES = [
    ("bf16", {}), ("fp16", {}),
    ("fp8_e4m3", {"scaling": "none"}), ("fp8_e5m2", {"scaling": "none", "overflow": "inf"}),
    ("fp8_e4m3", {}), ("fp8_e5m2", {"margin": 2}), ("fp8_e4m3", {"power_of_two_scales": True}),
    ("fp8_e4m3", {"scaling": "delayed"}), ("fp8_e4m3", {"overflow": "inf"}),
    ("fp8_e4m3", {"hadamard": 16}), ("fp8_e5m2", {"nonfinite": "te"}),
    ("hifp8", {}), ("hifp8", {"overflow": "inf"}), ("hifp8", {"scaling": "tensor", "power_of_two_scales": True}),
    ("hifp8", {"scaling": "delayed", "margin": 1}),
]


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
@pytest.mark.parametrize("name, options", CASES, ids=[f"{n}-{o}" for n, o in CASES])
def test_elementwise_formats_match_the_torch_path(name, options, rounding, kernel_device):
    fmt = get_format(name, **options, rounding=rounding, seed=5)
    twin = triton_twin(fmt)
    for dtype, specials in ((torch.float32, True), (torch.float32, False), (torch.bfloat16, False)):
        # Specials (Inf/NaN amax: scale 1), and finite values (a real per-tensor scale).
        x = wide_values((24, 64), seed=len(name) + len(options), dtype=dtype, device=kernel_device,
                        specials=specials)
        # Delayed scaling takes the history's amax: one below x's own, so some values overflow.
        amax = torch.tensor(100.0, device=kernel_device) if options.get("scaling") == "delayed" else None
        for call in ("quantize", "quantize_for_gemm"):
            ours = getattr(twin, call)(x, -1, amax)
            assert_same_result(ours, getattr(fmt, call)(x, -1, amax), f"{call} {dtype} specials={specials}")


def test_stochastic_noise_follows_key_and_tensor_parallel_shard(kernel_device):
    """The kernel's noise is the torch path's for a key and for a shard's global element indices:
    a column shard of the global tensor quantizes to the same bits as that slice of the whole."""
    fmt = get_format("hifp8", rounding="stochastic")
    x = wide_values((8, 6, 32), seed=3, device=kernel_device)
    bits = RandomBits.derive("kernel", 7)
    whole = triton_twin(fmt).quantize(x, noise=bits)
    assert_same_result(whole, fmt.quantize(x, noise=bits), "unsharded")
    column = Shard(dim=1, rank=1, world=3)
    local = x.chunk(3, dim=1)[1]
    ours = triton_twin(fmt).quantize(local, noise=bits.sharded(column))
    assert_same_result(ours, whole.chunk(3, dim=1)[1], "a shard is its slice of the global tensor")
    grouped = bits.sharded(Shard(dim=-1, rank=1, world=2, groups=2))  # e.g. a fused SwiGLU fc1
    assert_same_result(triton_twin(fmt).quantize(x, noise=grouped), fmt.quantize(x, noise=grouped), "groups")
    assert not torch.equal(whole, triton_twin(fmt).quantize(x, noise=bits.child("other")))


def test_casts_of_their_own_dtype_and_empty_tensors_take_the_torch_path(kernel_device):
    twin = triton_twin(get_format("bf16"))
    x = torch.randn(4, 4, device=kernel_device, dtype=torch.bfloat16)
    assert twin.quantize(x) is x and not twin.serves(x)
    assert not twin.serves(torch.empty(0, device=kernel_device))


@pytest.mark.parametrize("nonfinite", ["propagate", "te"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_the_one_read_amax_is_the_torch_paths(nonfinite, dtype, kernel_device, monkeypatch):
    """``amax_of`` (per-tensor scales, NVFP4's tensor scale, delayed scaling's history) from the
    amax kernel: NaN propagates or is skipped as the format says, Inf and signed zeros as torch."""
    fmt = get_format("fp8_e4m3", scaling="tensor", nonfinite=nonfinite)
    twin = triton_twin(fmt)
    x = wide_values((3, 4992), seed=8).to(kernel_device, dtype)  # holds +-0, +-Inf and a NaN
    cases = {"specials": x, "finite": torch.nan_to_num(x, nan=1.0, posinf=2.0, neginf=-3.0),
             "zeros": -torch.zeros(70, device=kernel_device, dtype=dtype),
             "all NaN": torch.full((9,), float("nan"), device=kernel_device, dtype=dtype)}
    for case, value in cases.items():
        assert_same_result(twin.amax_of(value), fmt.amax_of(value), case)
    from megatron.quant.kernels import amax

    monkeypatch.setattr(amax, "program_elements", lambda on_device: 1024)  # rows from many programs
    assert_same_result(twin.amax_of(x), fmt.amax_of(x), "many programs")
    hadamard = get_format("nvfp4", hadamard=16, nonfinite=nonfinite)
    finite = cases["finite"]
    assert_same_result(triton_twin(hadamard).amax_of(finite, -1), hadamard.amax_of(finite, -1), "hadamard")


@pytest.mark.parametrize("options", [{"scaling": "delayed"}, {"scaling": "delayed", "nonfinite": "te"},
                                     {"scaling": "delayed", "rounding": "stochastic"}])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_delayed_scaling_takes_the_amax_it_records_in_the_quantizing_read(options, dtype, kernel_device,
                                                                          monkeypatch):
    """Delayed scaling quantizes with the history's amax and records x's own: the kernel returns both
    the GEMM operand and x's amax from one read (no amax kernel), the torch path's bits, NaN included."""
    from megatron.quant.kernels import elementwise, triton_format

    fmt = get_format("fp8_e4m3", **options)
    twin = triton_twin(fmt)
    history_amax = torch.tensor(100.0, device=kernel_device)
    monkeypatch.setattr(elementwise, "program_elements", lambda on_device: 256)  # amax rows from many programs
    monkeypatch.setattr(triton_format, "one_read_abs_max", lambda *a, **k: pytest.fail("read again for the amax"))
    for specials in (False, True):
        x = wide_values((24, 64), seed=13, dtype=dtype, device=kernel_device, specials=specials)
        values, scale, own = twin.quantize_for_gemm_with_amax(x, -1, history_amax)
        assert_same_result((values, scale), fmt.quantize_for_gemm(x, -1, history_amax), f"specials={specials}")
        assert_same_result(own, fmt.amax_of(x, -1), f"amax, specials={specials}")
