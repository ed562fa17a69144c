"""llama-tiny trains under te-fp8-current with exact FP32 sums (CUSTOM_QUANT_ACCUMULATE=exact) and as the
preset comes, with a Hopper FP8 tensor core's accumulation (TE's per GEMM: forward fast, gradients promoted:
two short steps), from the session's shared runs (conftest's one_rank)."""
import math

import pytest

pytestmark = pytest.mark.slow


def test_te_fp8_current_trains_with_both_accumulations(one_rank):
    exact, hopper = one_rank["preset_te-fp8-current"], one_rank["accumulate_hopper"]  # exact sums: pinned
    assert len(hopper) == 2 and all(math.isfinite(record["lm loss"]) for record in exact + hopper)
    assert exact[-1]["lm loss"] < exact[0]["lm loss"] and hopper[1]["lm loss"] < hopper[0]["lm loss"]
