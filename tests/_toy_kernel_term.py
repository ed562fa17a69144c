"""The toy statistic's kernel term (tests/test_extending.py): a module of its own, since a Triton
function reads ``tl`` from its module's globals and the test module imports without Triton."""
import triton
import triton.language as tl


@triton.jit
def abs_sum_term(x, q, is_finite, both):
    return tl.where(is_finite, tl.abs(x), 0.0).to(tl.float64)
