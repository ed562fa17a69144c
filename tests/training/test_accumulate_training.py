"""llama-tiny trains under te-fp8-current with exact FP32 sums and with a Hopper FP8 tensor core's
accumulation (TE's per GEMM: forward fast, gradients promoted): two short steps each, from the
session's shared runs (conftest's one_rank)."""
import math

import pytest

pytestmark = pytest.mark.slow


def test_te_fp8_current_trains_with_both_accumulations(one_rank):
    exact, hopper = one_rank["accumulate_te-fp8-current"], one_rank["accumulate_te-fp8-current+hopper-acc"]
    assert len(exact) == len(hopper) == 2
    for a, b in zip(exact, hopper):
        assert math.isfinite(a["lm loss"]) and math.isfinite(b["lm loss"])
        assert abs(a["lm loss"] - b["lm loss"]) < 0.02 * a["lm loss"]  # the same recipe, other sums
    assert exact[0]["lm loss"] != hopper[0]["lm loss"]  # the forward's fast accumulation changes the loss
    assert hopper[1]["lm loss"] < hopper[0]["lm loss"]
