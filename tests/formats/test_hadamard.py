"""Random Hadamard transform: the matrix against scipy's Sylvester construction and TE's signs,
orthogonality and inverse, transform-then-quantize against the block oracles, and the
cancellation in a weight-gradient GEMM whose two operands are transformed along tokens."""
import numpy as np
import pytest
import scipy.linalg
import torch

from megatron.quant.formats import get_format
from tests.formats._blocks_oracle import mx_reference, nvfp4_reference
from tests.formats._oracle import mismatches

TE_SIGNS_16 = [1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1]  # TE get_wgrad_sign_vector


def rht_matrix(signs) -> np.ndarray:
    """diag(s) @ H_n / sqrt(n) in float64."""
    n = len(signs)
    return np.diag(np.asarray(signs, np.float64)) @ scipy.linalg.hadamard(n) / np.sqrt(n)


def transform(x: np.ndarray, signs, axis: int) -> np.ndarray:
    """Every group of n consecutive elements along ``axis``, as a row vector g, times R (float64)."""
    moved = np.moveaxis(x.astype(np.float64), axis, -1)
    groups = moved.reshape(*moved.shape[:-1], -1, len(signs)) @ rht_matrix(signs)
    return np.moveaxis(groups.reshape(moved.shape), -1, axis)


def _data(shape, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-8, 8, shape))  # outliers for the RHT to spread
    return x.astype(np.float32)


@pytest.mark.parametrize("name, n, signs", [("nvfp4", 16, TE_SIGNS_16), ("mxfp4", 32, TE_SIGNS_16 * 2),
                                            ("mxfp8", 8, TE_SIGNS_16[:8])])
def test_matrix_signs_orthogonality_and_inverse(name, n, signs):
    fmt = get_format(name, hadamard=n)
    assert fmt.transforms_operand and list(fmt.options["hadamard_signs"]) == signs
    matrix = fmt.hadamard.matrix.double().numpy()
    assert np.array_equal(matrix, rht_matrix(signs).astype(np.float32).astype(np.float64))
    assert np.abs(matrix @ matrix.T - np.eye(n)).max() < 1e-6
    x = _data((6, 4 * n), seed=n)
    for axis in (-1, 0) if x.shape[0] % n == 0 else (-1,):
        forward = fmt.hadamard.forward(torch.from_numpy(x), axis, name).numpy()
        np.testing.assert_allclose(forward, transform(x, signs, axis), rtol=1e-5, atol=1e-6 * np.abs(x).max())
        back = fmt.hadamard.inverse(torch.from_numpy(forward), axis, name).numpy()
        np.testing.assert_allclose(back, x, rtol=1e-5, atol=1e-6 * np.abs(x).max())


def test_custom_signs_and_amax_of():
    signs = [1, -1] * 8
    fmt = get_format("nvfp4", hadamard=16, hadamard_signs=signs)
    x = _data((4, 64), seed=1)
    transformed = transform(x, signs, -1)
    assert np.isclose(fmt.amax_of(torch.from_numpy(x)).item(), np.abs(transformed).max(), rtol=1e-6)
    assert get_format("nvfp4").amax_of(torch.from_numpy(x)).item() == np.abs(x).max()


@pytest.mark.parametrize("name, n, axis", [("nvfp4", 16, -1), ("nvfp4", 16, 0), ("mxfp4_e2m1", 32, 0),
                                           ("mxfp8_e4m3", 32, -1)])
def test_transform_then_quantize_equals_the_oracle(name, n, axis):
    fmt = get_format(name, hadamard=n)
    x = torch.from_numpy(_data((64, 96), seed=n + axis))
    xt = fmt.hadamard.forward(x, axis, name)  # float32 transform, checked against float64 above
    moved = np.moveaxis(xt.numpy(), axis, -1)
    if name == "nvfp4":
        expected_t, expected_scale = nvfp4_reference(moved)
    else:
        expected_t, expected_scale = mx_reference(moved, "fp8_e4m3" if "fp8" in name else "fp4_e2m1", "floor")
    expected_t = np.moveaxis(expected_t, -1, axis)
    operand, tensor_scale = fmt.quantize_for_gemm(x, axis=axis)  # stays in the transformed domain
    decoded = operand if tensor_scale is None else operand * tensor_scale
    assert not mismatches(decoded, expected_t, xt)
    q, scale = fmt.quantize_with_scale(x, axis=axis)  # back in x's domain
    assert not mismatches(scale, np.moveaxis(expected_scale, -1, axis))
    assert torch.equal(q, fmt.hadamard.inverse(torch.from_numpy(expected_t), axis, name))
    assert torch.equal(fmt.quantize(x, axis=axis), q)
    assert fmt.amax_of(x, axis).item() == xt.abs().max().item()


@pytest.mark.parametrize("name, n", [("nvfp4", 16), ("mxfp4", 32)])
def test_wgrad_gemm_cancels_the_transform(name, n):
    """dW = dY^T X over tokens: both operands transformed along the token axis (0)."""
    rng = np.random.default_rng(n)
    tokens, d_out, d_in = 256, 48, 64
    dy = torch.from_numpy((rng.standard_normal((tokens, d_out))
                           * np.exp2(rng.integers(-4, 4, (1, d_out)))).astype(np.float32))
    x = torch.from_numpy((rng.standard_normal((tokens, d_in))
                          * np.exp2(rng.integers(-4, 4, (1, d_in)))).astype(np.float32))
    x[7, 3] = 300.0  # an outlier
    fmt = get_format(name, hadamard=n)
    exact = dy.double().T @ x.double()
    # Without quantization the transform cancels: (B dY)^T (B X) = dY^T X.
    bdy, bx = fmt.hadamard.forward(dy, 0, name), fmt.hadamard.forward(x, 0, name)
    assert torch.allclose(bdy.double().T @ bx.double(), exact, rtol=1e-5, atol=1e-4 * exact.abs().max().item())
    # The GEMM on the operands (transformed domain) with the tensor scales on the accumulator ...
    (op_dy, s_dy), (op_x, s_x) = fmt.quantize_for_gemm(dy, axis=0), fmt.quantize_for_gemm(x, axis=0)
    dw = op_dy.double().T @ op_x.double()
    for s in (s_dy, s_x):
        dw = dw if s is None else dw * s.double()
    # ... equals the product of the fake-quantized tensors in x's domain (B orthogonal) ...
    q_dy, q_x = fmt.quantize(dy, axis=0), fmt.quantize(x, axis=0)
    assert torch.allclose(q_dy.double().T @ q_x.double(), dw, rtol=1e-5, atol=1e-5 * dw.abs().max().item())
    # ... and approximates dY^T X within the format's quantization error.
    error = ((dw - exact).norm() / exact.norm()).item()
    assert error < (0.15 if name == "nvfp4" else 0.25), error


def test_hadamard_errors():
    with pytest.raises(ValueError, match=r"nvfp4: hadamard=12 must be a power of two"):
        get_format("nvfp4", hadamard=12)
    with pytest.raises(ValueError, match=r"hadamard=32 does not divide the block length 16"):
        get_format("nvfp4", hadamard=32)
    with pytest.raises(ValueError, match=r"fp8_e4m3: hadamard needs scaling in \['tensor', 'block'\]"):
        get_format("fp8_e4m3", scaling="none", hadamard=16)
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['hadamard'\]"):
        get_format("hifp8", hadamard=16)
    with pytest.raises(ValueError, match=r"hadamard_signs has 3 entries; hadamard=16 needs 16"):
        get_format("nvfp4", hadamard=16, hadamard_signs=[1, -1, 1])
    with pytest.raises(ValueError, match=r"hadamard_signs=\[1, 0\] must be a list of \+1 and -1"):
        get_format("nvfp4", hadamard=2, hadamard_signs=[1, 0])
    with pytest.raises(ValueError, match="hadamard_signs needs hadamard"):
        get_format("nvfp4", hadamard_signs=TE_SIGNS_16)
    with pytest.raises(ValueError, match=r"hadamard=16 needs the length along axis -1 \(40\) to be a multiple of 16"):
        get_format("nvfp4", hadamard=16).quantize(torch.ones(2, 40))


def test_fp8_tensor_scaling_with_hadamard():
    fmt = get_format("fp8_e4m3", hadamard=16)
    x = torch.from_numpy(_data((32, 32), seed=2))
    xt = fmt.hadamard.forward(x, -1, "fp8_e4m3")
    amax = fmt.amax_of(x)
    operand, scale = fmt.quantize_for_gemm(x, amax=amax)
    assert scale is not None and torch.equal(operand * scale, get_format("fp8_e4m3").quantize(xt, amax=amax))
