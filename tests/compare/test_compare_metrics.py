"""Error metrics against analytic cases, and the per-tensor summary against numpy."""
import math

import numpy as np
import pytest

from megatron.quant.compare.metrics import describe, error_vs_reference


def test_scaled_copy_has_analytic_errors():
    ref = np.random.default_rng(0).standard_normal((4, 8, 16))
    eps = 2.0 ** -6
    errors = error_vs_reference(ref * (1 + eps), ref)
    # x = (1 + eps) ref: ||x - ref|| / ||ref|| = eps, SQNR = -20 log10(eps), cosine 1.
    assert errors["relative_error"] == pytest.approx(eps, rel=1e-9)
    assert errors["sqnr_db"] == pytest.approx(-20 * math.log10(eps), rel=1e-9)
    assert errors["cosine"] == pytest.approx(1.0, abs=1e-12)
    assert errors["mse"] == pytest.approx(eps ** 2 * np.mean(ref ** 2), rel=1e-9)
    assert errors["mae"] == pytest.approx(eps * np.mean(np.abs(ref)), rel=1e-9)
    assert errors["max_abs_error"] == pytest.approx(eps * np.abs(ref).max(), rel=1e-9)


def test_identical_arrays_have_zero_error_and_no_finite_sqnr():
    ref = np.arange(-5, 7, dtype=np.float32)
    errors = error_vs_reference(ref.copy(), ref)
    assert errors["mse"] == errors["mae"] == errors["max_abs_error"] == errors["relative_error"] == 0.0
    assert errors["sqnr_db"] is None
    assert errors["cosine"] == pytest.approx(1.0)


def test_orthogonal_and_opposite_vectors():
    assert error_vs_reference(np.array([0.0, 1.0]), np.array([1.0, 0.0]))["cosine"] == 0.0
    opposite = error_vs_reference(np.array([-1.0, -2.0]), np.array([1.0, 2.0]))
    assert opposite["cosine"] == pytest.approx(-1.0)
    assert opposite["relative_error"] == pytest.approx(2.0)


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match=r"shape \[3\] differs from the reference's \[4\]"):
        error_vs_reference(np.zeros(3), np.zeros(4))


def test_describe_matches_numpy():
    x = np.random.default_rng(1).standard_normal((2, 5, 3)).astype(np.float32)
    summary = describe(x)
    assert summary["shape"] == [2, 5, 3]
    assert summary["first_10"] == x.reshape(-1)[:10].astype(np.float64).tolist()
    assert summary["mean"] == pytest.approx(np.mean(x, dtype=np.float64), rel=1e-12)
    assert summary["std"] == pytest.approx(np.std(x, dtype=np.float64), rel=1e-12)
    assert (summary["min"], summary["max"]) == (float(x.min()), float(x.max()))
    assert summary["nans"] == summary["infs"] == 0
