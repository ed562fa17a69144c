"""The kernels' work model (bench/gpu/work_model.py): SASS counted as nvdisasm prints it, the bytes a
launch moves, and the budget from the H100's issue rate over its bandwidth."""
import math

import pytest
import torch

from bench.gpu import work_model
from megatron.quant.kernels.constants import Layout

SASS = """
        .text._k:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
.L_x_2:
        /*0010*/              @!P0 LDG.E.128 R4, desc[UR4][R8.64] ;
        /*0020*/                   FMUL R17, R4, R17 ;
        /*0030*/               @P1 BRA `(.L_x_2) ;
        /*0040*/                   STG.E.128 desc[UR4][R2.64], R4 ;
        /*0050*/                   EXIT ;
.L_x_0:
        /*0060*/                   BRA `(.L_x_0);
        /*0070*/                   NOP;
        /*0080*/                   NOP;
"""


def test_sass_counts_every_instruction_but_the_padding_and_finds_loops():
    assert work_model.sass_counts(SASS) == {"instructions": 6, "global_loads": 1, "global_stores": 1,
                                            "backward_branches": 1}
    with pytest.raises(ValueError, match="no SASS instructions"):
        work_model.sass_counts("// nothing here")


def test_the_budget_is_the_issue_rate_over_the_bandwidth_at_the_goal_share():
    issue = 132 * 4 * 32 * 1.98e9  # SMs x schedulers x threads a warp x clock
    assert math.isclose(work_model.INSTRUCTIONS_PER_BYTE, issue / 3.35e12)
    assert math.isclose(work_model.budget(4.0, "cast"), 4.0 * issue / 3.35e12 / 0.85)
    assert math.isclose(work_model.budget(4.0, "statistics"), 1.1 * work_model.budget(4.0, "cast"))  # 1.1x the cast
    assert work_model.budget(4.0, "hadamard or stochastic") > work_model.budget(4.0, "both axes") > (
        work_model.budget(4.0, "cast"))


def test_bytes_count_each_distinct_tensor_once():
    x, out, rows = torch.zeros(64, dtype=torch.bfloat16), torch.zeros(64, dtype=torch.bfloat16), torch.zeros(2, 16)
    assert work_model.bytes_per_element([x, out, x, rows], x.numel()) == (128 + 128 + 128) / 64


def test_program_elements_and_classes_follow_the_kernels_constants():
    layout = Layout(block=16, padded=16, side=16, tiled=False, columns=64, transposed=False)
    assert work_model.program_elements("_block_kernel", {"LAYOUT": layout}) == 1024
    assert work_model.program_elements("_dual_kernel", {"B": 128}) == 128 * 128
    assert work_model.kernel_class("_elementwise_kernel", {"STATS": 2, "STOCHASTIC": 0}) == "statistics"
    assert work_model.kernel_class("_block_kernel", {"STATS": 0, "STOCHASTIC": 8, "AMAX_ONLY": False}) == (
        "hadamard or stochastic")
    assert work_model.kernel_class("_block_kernel", {"STATS": 0, "AMAX_ONLY": True}) == "amax"
    with pytest.raises(ValueError, match="no work model for kernel '_other'"):
        work_model.program_elements("_other", {})


def test_every_registered_quantization_kernel_has_a_work_model_and_the_gemm_model_is_left_out():
    """``kernel_build --cubin`` budgets the kernels in ``MODELLED`` and lists the others' instructions without
    a budget: the accumulation model's GEMM kernel made the whole build fail."""
    from bench.kernel_work_table import table

    assert "_hopper_kernel" not in work_model.MODELLED
    with pytest.raises(ValueError, match="no work model for kernel '_hopper_kernel'"):
        work_model.program_elements("_hopper_kernel", {})
    rows = [{"first_launched_by": "hifp8 float32 quantize", "class": "cast", "bytes_per_element": 8,
             "instructions_per_element": 30.0, "budget_per_element": 94.0, "over_budget": False},
            {"first_launched_by": "hopper accumulation e4m3xe4m3 fast", "class": None, "sass_instructions": 1300}]
    assert table(rows)[2:] == ["| hifp8 | cast | 8 B, 30 (94) | - | 0 of 1 |"]
