"""Transformer Engine's kernels at the edges, against oracles written from TE's source (commit
d0067d0): FP8 block scales of 16-bit inputs whose quotient overflows FP32, and Inf / NaN as the
kernels treat them (``nonfinite="te"``, used by the te-* presets) next to today's default."""
import ml_dtypes
import numpy as np
import pytest
import torch

from megatron.quant.formats import get_format
from megatron.quant.recipes.recipe import QuantRecipe
from tests.formats._blocks_oracle import fmax_amax, fp8_block_reference, mx_reference, nvfp4_blocks_reference
from tests.formats._oracle import mismatches, tensor_scaled_reference

BF16_MAX = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
FP32_MAX = float(np.finfo(np.float32).max)


def _blocks(x: np.ndarray, size: int) -> np.ndarray:
    return x.reshape(x.shape[0], -1, size)


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("dtype, value_for_inf", [(torch.bfloat16, BF16_MAX), (torch.float32, FP32_MAX)])
def test_fp8_blocks_of_tiny_amax_take_the_input_dtypes_max(name, dtype, value_for_inf):
    """``compute_scale_from_types`` (``recipe_common.cuh`` line 67) passes
    ``TypeInfo<IType>::max_finite_value`` as the scale when max_fp8 / amax overflows FP32
    (lines 35-38); TE's reference takes ``torch.finfo(x_dtype).max`` (``tests/pytorch/references/
    quantize_scale_calc.py`` line 35). bf16 blocks with amax below ~1e-36 used to get FP32's max."""
    rng = np.random.default_rng(7)
    binades = rng.integers(-133, -110, (8, 1))  # bf16 subnormals up to amaxes whose quotient is finite
    x = torch.from_numpy((rng.uniform(-1, 1, (8, 256)) * np.exp2(binades)).astype(np.float32)).to(dtype)
    fmt = get_format(name, scaling="block", power_of_two_scales=False)
    q, scale = fmt.quantize_with_scale(x)
    expected_q, expected_scale = fp8_block_reference(_blocks(x.float().numpy(), 128), name, False, value_for_inf)
    assert not mismatches(scale, expected_scale.reshape(8, -1))
    expected_q = torch.from_numpy(expected_q.reshape(8, -1)).to(dtype)
    assert not mismatches(q, expected_q, x)
    overflowed = expected_scale.reshape(8, -1) == np.float32(1 / np.float32(value_for_inf))
    assert overflowed.any() and not overflowed.all()  # the data reaches the edge from both sides


def _with_nonfinite(rows: int, length: int, seed: int) -> np.ndarray:
    """Normal data over a few binades with a NaN in some rows, an Inf in others, both in one."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, length)) * np.exp2(rng.integers(-8, 8, (rows, 1)))).astype(np.float32)
    x[0, 5] = np.nan
    x[1, 9] = -np.inf
    x[2, 3], x[2, 40] = np.nan, np.inf
    x[3, :] = np.nan  # all NaN: an amax of 0 under fmaxf
    return x


@pytest.mark.parametrize("name", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("nonfinite", ["propagate", "te"])
def test_fp8_blocks_nonfinite(name, nonfinite):
    """te: the block amax is fmaxf from 0 (``quantize_transpose_vector_blockwise.cu`` line 281,
    square tiles line 129), so NaN is skipped; an Inf amax gives scale 1 (``recipe_common.cuh``
    line 24); the cast saturates Inf and keeps NaN. propagate (the default): the block is NaN."""
    x = _with_nonfinite(6, 256, 1)
    fmt = get_format(name, scaling="block", nonfinite=nonfinite)
    q, scale = fmt.quantize_with_scale(torch.from_numpy(x))
    expected_q, expected_scale = fp8_block_reference(_blocks(x, 128), name, True, te=nonfinite == "te")
    assert not mismatches(q, expected_q.reshape(6, -1), x) and not mismatches(scale, expected_scale.reshape(6, -1))
    assert torch.isnan(q[0]).sum().item() == (1 if nonfinite == "te" else 128)


@pytest.mark.parametrize("name, element", [("mxfp8_e4m3", "fp8_e4m3"), ("mxfp8_e5m2", "fp8_e5m2")])
@pytest.mark.parametrize("nonfinite", ["propagate", "te"])
def test_mx_blocks_nonfinite(name, element, nonfinite):
    """te: TE's MXFP8 block amax is fmaxf (``quantize_mxfp8.cuh`` lines 255-259), and
    ``float_to_e8m0`` turns an Inf amax into 0xFE (``ptx_arch_spec.cuh`` lines 89-91; Blackwell's
    ``cvt.rp.satfinite`` does the same), so the block's finite elements are cast with 2**127.
    propagate (the default, OCP's reference): E8M0 0xFF, the whole block NaN."""
    x = _with_nonfinite(6, 128, 2)
    fmt = get_format(name, scale_mode="rceil", nonfinite=nonfinite)
    assert get_format(name).options["nonfinite"] == "propagate"
    q, scale = fmt.quantize_with_scale(torch.from_numpy(x))
    expected_q, expected_scale = mx_reference(x, element, "rceil", te=nonfinite == "te")
    assert not mismatches(q, expected_q, x) and not mismatches(scale, expected_scale)


@pytest.mark.parametrize("nonfinite", ["propagate", "te"])
def test_nvfp4_blocks_nonfinite(nonfinite):
    """te: TE's NVFP4 kernels reduce block and tensor amaxes with fmaxf (NaN skipped); an Inf
    block amax gives S_dec_b = Inf, cast with satfinite to E4M3's 448 (``core_nvfp4.cuh`` lines
    40-66), and an Inf tensor amax a global encode of 1 (lines 82-95)."""
    x = _with_nonfinite(6, 64, 4)
    fmt = get_format("nvfp4", nonfinite=nonfinite)
    te = nonfinite == "te"
    for rows in (x[[0, 4, 5]], x):  # a NaN only (global amax finite under te), then Inf too
        q, scale = fmt.quantize_with_scale(torch.from_numpy(rows))
        global_amax = fmax_amax(rows.reshape(1, -1))[0, 0] if te else np.abs(rows).max()
        expected_q, expected_scale = nvfp4_blocks_reference(_blocks(rows, 16), global_amax, te)
        assert not mismatches(q, expected_q.reshape(rows.shape), rows)
        assert not mismatches(scale, expected_scale.reshape(rows.shape))


@pytest.mark.parametrize("scaling", ["tensor", "delayed"])
@pytest.mark.parametrize("nonfinite", ["propagate", "te"])
def test_per_tensor_amax_skips_nan_under_te(scaling, nonfinite):
    """te: the per-tensor amax kernel reduces with fmaxf / __hmax (``current_scaling.cu`` lines
    50-60), so a NaN leaves the scale to the finite values; Inf gives scale 1 either way. The
    amax a layer records or reduces (``amax_of``) follows the same rule."""
    x = _with_nonfinite(4, 64, 3)[[0, 1]]
    fmt = get_format("fp8_e4m3", scaling=scaling, nonfinite=nonfinite)
    for row in x:
        amax = fmax_amax(row[None])[0, 0] if nonfinite == "te" else np.abs(row).max()
        assert mismatches(fmt.amax_of(torch.from_numpy(row)), np.float32(amax)) == ""
        q, scale = fmt.quantize_with_scale(torch.from_numpy(row))
        expected, expected_scale = tensor_scaled_reference(row, "fp8_e4m3", amax, 448.0)
        assert scale.item() == expected_scale and not mismatches(q, expected, row)


def test_te_presets_take_the_kernel_behaviour():
    """Every operand of a te-* preset uses ``nonfinite="te"``; plain format names keep the default."""
    for preset in ("te-nvfp4", "te-mxfp8", "te-fp8-current", "te-fp8-blockwise", "te-fp8-delayed"):
        fmts = QuantRecipe.from_dict({"format": preset}).resolve("fc1", 0, 4)
        assert {f.options["nonfinite"] for f in fmts.values()} == {"te"}, preset
    fmts = QuantRecipe.from_dict({"format": "mxfp8_e4m3"}).resolve("fc1", 0, 4)
    assert {f.options["nonfinite"] for f in fmts.values()} == {"propagate"}
