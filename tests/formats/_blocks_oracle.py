"""numpy re-statements of the MX and NVFP4 formulas, and block test data.

Scales follow the issue's formulas (floor/ceil of log2 via numpy in float64); elements are
the ml_dtypes saturating cast of x / scale. Blocks run along the last axis of the input.
"""
import ml_dtypes
import numpy as np

from tests.formats._oracle import element_values, saturating_cast

MX_EMAX = {"fp8_e4m3": 8, "fp8_e5m2": 15, "fp6_e3m2": 4, "fp6_e2m3": 2, "fp4_e2m1": 2}  # from the issue
MX_MBITS = {"fp8_e4m3": 3, "fp8_e5m2": 2, "fp6_e3m2": 2, "fp6_e2m3": 3, "fp4_e2m1": 1}


def _blocks(x: np.ndarray, size: int) -> np.ndarray:
    pad = -x.shape[-1] % size
    padded = np.concatenate([x, np.zeros((*x.shape[:-1], pad), np.float32)], axis=-1)
    return padded.reshape(*x.shape[:-1], -1, size)


def _unblock(blocks: np.ndarray, length: int) -> np.ndarray:
    return blocks.reshape(*blocks.shape[:-2], -1)[..., :length]


def _round_mantissa_even(amax: np.ndarray, mbits: int) -> np.ndarray:
    """amax (float64) with its significand rounded to ``mbits`` fraction bits, ties to even."""
    significand, exponent = np.frexp(amax)  # significand in [0.5, 1)
    steps = 2.0 ** (mbits + 1)
    return np.ldexp(np.round(significand * steps) / steps, exponent)


def fmax_amax(blocks: np.ndarray) -> np.ndarray:
    """Per-block max |x| as TE's kernels reduce it: fmaxf from 0, so NaN is skipped."""
    return np.where(np.isnan(blocks), np.float32(0), np.abs(blocks)).max(-1, keepdims=True)


def mx_reference(x: np.ndarray, element: str, scale_mode: str, block: int = 32, te: bool = False
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(fake-quantized x, per-element scale) for MX with blocks of ``block`` along the last axis
    (torchao's four scale modes and the OCP one). ``te``: Inf and NaN as TE's MXFP8 kernel takes
    them: the amax skips NaN (``fmax_amax``) and an Inf amax gives E8M0 0xFE, 2**127
    (``float_to_e8m0``, TE d0067d0 ``common/util/ptx_arch_spec.cuh`` lines 86-91)."""
    blocks = _blocks(x, block)
    amax = fmax_amax(blocks) if te else np.abs(blocks).max(-1, keepdims=True)
    finite = np.isfinite(amax)
    safe = np.where(finite & (amax > 0), amax, 1).astype(np.float64)
    if scale_mode == "floor":
        exponent = np.floor(np.log2(safe)) - MX_EMAX[element]
    elif scale_mode == "ceil":
        exponent = np.ceil(np.log2(safe)) - MX_EMAX[element]
    elif scale_mode == "even":
        exponent = np.floor(np.log2(_round_mantissa_even(safe, MX_MBITS[element]))) - MX_EMAX[element]
    else:
        exponent = np.ceil(np.log2(safe / element_values(element).max()))
    exponent = np.where(amax == 0, -127, exponent).clip(-127, 127).astype(np.int32)
    scale = np.ldexp(np.float32(1), exponent).astype(np.float32)
    assert np.array_equal(scale.astype(ml_dtypes.float8_e8m0fnu).astype(np.float32), scale)
    scale = np.where(finite, scale, np.float32(2.0**127) if te else np.nan).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        q = saturating_cast(blocks / scale, element) * scale
    return _unblock(q, x.shape[-1]), _unblock(np.broadcast_to(scale, blocks.shape), x.shape[-1])


def nvfp4_global_encode(amax) -> np.float32:
    """TE's (448 * 6) / amax in float32: FP32 max when that overflows, 1 for amax 0, Inf or NaN."""
    amax = np.float32(amax)
    if not np.isfinite(amax) or amax == 0:
        return np.float32(1)
    with np.errstate(over="ignore"):
        encode = np.float32(448 * 6) / amax
    return min(encode, np.finfo(np.float32).max)


def nvfp4_blocks_reference(blocks: np.ndarray, global_amax, te: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(fake-quantized blocks, per-block scale) for NVFP4 blocks along the last axis, the kernels'
    arithmetic step by step in float32 (the issue's formulas). ``te``: Inf and NaN as TE's
    kernels take them: block amaxes skip NaN (fmaxf, ``quantize_transpose_nvfp4.cuh``) and an Inf
    block amax gives the saturated E4M3 scale 448 (``static_cast<fp8e4m3>`` with satfinite of
    ``fminf(S_dec_b, FLT_MAX)``, ``core_nvfp4.cuh`` lines 40-53)."""
    f32 = np.float32
    global_encode = nvfp4_global_encode(global_amax)
    global_decode = f32(1) / global_encode
    amax_block = fmax_amax(blocks) if te else np.abs(blocks).max(-1, keepdims=True)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        block_decode = saturating_cast(amax_block * (global_encode * f32(1 / 6)), "fp8_e4m3")
        block_decode = np.where(np.isfinite(amax_block) | te, block_decode, np.nan).astype(f32)
        scale = (block_decode * global_decode).astype(f32)
        encode = (f32(1) / scale).astype(f32)
        elements = np.where(scale == 0, f32(0), saturating_cast(blocks * encode, "fp4_e2m1"))
        q = ((elements * block_decode).astype(f32) * global_decode).astype(f32)
    return q, np.broadcast_to(scale, blocks.shape)


def nvfp4_reference(x: np.ndarray, amax=None) -> tuple[np.ndarray, np.ndarray]:
    """(fake-quantized x, per-element scale) for NVFP4 with blocks of 16 along the last axis."""
    q, scale = nvfp4_blocks_reference(_blocks(x, 16), np.abs(x).max() if amax is None else amax)
    return _unblock(q, x.shape[-1]), _unblock(scale, x.shape[-1])


def nvfp4_divide_block_scale(amax_block, global_amax) -> np.ndarray:
    """The E4M3 block scale of the previous order, E4M3((amax_block / 6) / (amax / 2688))."""
    global_amax = np.float32(global_amax)
    global_scale = np.float32(1) if not np.isfinite(global_amax) or global_amax == 0 else \
        max(global_amax / np.float32(448.0 * 6.0), np.finfo(np.float32).tiny)
    return saturating_cast(np.float32(amax_block) / np.float32(6) / global_scale, "fp8_e4m3")


def fp8_block_reference(blocks: np.ndarray, element: str, power_of_two: bool, value_for_inf=np.finfo(np.float32).max,
                        te: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(fake-quantized blocks, per-block decode scale) for FP8 block scaling along the last axis:
    encode = max / amax (float32; ``value_for_inf`` on overflow: TE's ``compute_scale_from_types``
    passes the input dtype's max, ``recipe_common.cuh`` line 67; 1 for amax 0), rounded down to a
    power of two when asked; a block with Inf or NaN is NaN, or with ``te`` as TE's blockwise
    kernels: the amax skips NaN (fmaxf, ``quantize_transpose_vector_blockwise.cu`` line 281) and
    an Inf amax gives encode 1 (``recipe_common.cuh`` line 24)."""
    f32 = np.float32
    amax = fmax_amax(blocks) if te else np.abs(blocks).max(-1, keepdims=True)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        encode = f32(element_values(element).max()) / amax
        encode = np.where(np.isinf(encode), f32(value_for_inf), encode).astype(f32)
        encode = np.where((amax == 0) | np.isinf(amax), f32(1), encode)
        if power_of_two:
            encode = np.exp2(np.floor(np.log2(encode.astype(np.float64)))).astype(f32)
        scale = np.where(np.isfinite(amax) | te, f32(1) / encode, np.nan).astype(f32)
        q = (saturating_cast(blocks * encode, element) * scale).astype(f32)
    return q, np.broadcast_to(scale, blocks.shape)


def tiled_reference(x: np.ndarray, side: int, one_block) -> tuple[np.ndarray, np.ndarray]:
    """Per-tile loop over the last two axes of x: ``one_block(values)`` quantizes a tile's
    values given as one (1, n) block and returns (q, per-element scale) of that shape."""
    q, scale = np.empty_like(x), np.empty_like(x)
    for index in np.ndindex(*x.shape[:-2]):
        for i in range(0, x.shape[-2], side):
            for j in range(0, x.shape[-1], side):
                tile = x[index][i : i + side, j : j + side]
                tile_q, tile_scale = one_block(tile.reshape(1, -1))
                q[index][i : i + side, j : j + side] = tile_q.reshape(tile.shape)
                scale[index][i : i + side, j : j + side] = tile_scale.reshape(tile.shape)
    return q, scale


def block_test_data(element: str, rows: int, length: int, block: int, seed: int,
                    binades: tuple[int, int] = (-135, 127)) -> np.ndarray:
    """Rows of blocks that exercise the edge cases: a random binade per block in ``binades``
    (clipped so that max * 2**j stays finite), in-block dynamic range reaching the element subnormals, all-zero blocks,
    exact ties (element midpoints next to the element max, so the scale is exact), and
    amax exactly at / one ulp around the scale thresholds (2**j and max * 2**j)."""
    rng = np.random.default_rng(seed)
    n_blocks = -(-length // block)
    top = element_values(element).max()
    values = element_values(element)
    values = values[values >= 0]
    midpoints = ((values[1:] + values[:-1]) / 2).astype(np.float32)
    data = np.empty((rows, n_blocks, block), np.float32)
    for r in range(rows):
        for b in range(n_blocks):
            j = int(rng.integers(binades[0], min(binades[1], 126 - int(np.log2(top)))))
            kind = (r * n_blocks + b) % 6
            if kind == 0:  # wide dynamic range inside the block
                data[r, b] = rng.standard_normal(block) * np.exp2(rng.uniform(-25, 0, block))
            elif kind == 1:
                data[r, b] = 0.0
            elif kind == 2:  # ties on the element grid
                data[r, b] = rng.choice(np.concatenate([midpoints, -midpoints]), block)
                data[r, b, 0] = top
            elif kind == 3:  # amax at a threshold
                edge = np.float32(rng.choice([1.0, top]))
                data[r, b] = rng.uniform(-1, 1, block) * edge
                data[r, b, 0] = rng.choice([edge, np.nextafter(edge, 0), np.nextafter(edge, 2 * edge)])
            else:
                data[r, b] = rng.standard_normal(block)
            data[r, b] = np.ldexp(data[r, b], j if kind != 1 else 0)
    return data.reshape(rows, -1)[:, :length]
