"""The one operand table (``recipes.operands.LINEAR_TABLE``, ``BMM_SLOTS``): what megatron-core's
tensor-parallel layers split, checked against an independent statement of it, and a made-up seventh
linear operand that the layers' specs, shard dimensions, block checks and the what-if comparison
all pick up from one added row."""
import dataclasses

import pytest
import torch

from megatron.quant import formats
from megatron.quant.compare import whatif
from megatron.quant.layers.bmm_function import BmmQuant
from megatron.quant.layers.linear_function import LinearQuant
from megatron.quant.recipes import operands
from megatron.quant.recipes.operands import LinearOperand

# megatron-core: ColumnParallelLinear splits W [out, in] along out (so dY's last dimension),
# RowParallelLinear along in (so X's last dimension); X and dY are [tokens, features].
SPLIT = {"column": {"fprop.weight": 0, "dgrad.grad_output": -1, "dgrad.weight": 0, "wgrad.grad_output": -1},
         "row": {"fprop.input": -1, "fprop.weight": 1, "dgrad.weight": 1, "wgrad.input": -1}}
# Each GEMM's reduction dimension: Y = X W^T over in, dX = dY W over out, dW = dY^T X over tokens.
REDUCED = {"fprop.input": -1, "fprop.weight": 1, "dgrad.grad_output": -1, "dgrad.weight": 0,
           "wgrad.grad_output": 0, "wgrad.input": 0}
# A made-up operand: a GEMM of its own on dY, blocked along tokens.
SEVENTH = LinearOperand("xgrad", "grad_output", axis=0, column_shard=-1, row_shard=None, captured="backward")


def _unquantized(table=None) -> dict:
    return {op.key: None for op in (table or operands.LINEAR_TABLE)}


def test_the_table_states_megatrons_sharding_and_the_gemms_axes():
    quant = LinearQuant.from_formats(_unquantized())
    assert {key: spec.axis for key, spec in quant.specs.items()} == REDUCED == operands.LINEAR_AXES
    for parallel, split in SPLIT.items():
        sharded = quant.sharded(parallel, groups=2)
        assert {k: s.shard_dim for k, s in sharded.specs.items() if s.shard_dim is not None} == split
        assert all(s.shard_groups == 2 for k, s in sharded.specs.items() if k in split)
    assert operands.LINEAR_OPERANDS == tuple(REDUCED)
    assert [op.key for op in operands.LINEAR_TABLE if op.along_tokens] == ["wgrad.grad_output", "wgrad.input"]


def test_bmm_quant_has_one_field_per_slot():
    assert [f.name for f in dataclasses.fields(BmmQuant)] == [slot.name for slot in operands.BMM_SLOTS]
    quant = BmmQuant.from_formats(dict.fromkeys(operands.QK_OPERANDS), operands.QK_OPERANDS)
    assert [getattr(quant, slot.name).axis for slot in operands.BMM_SLOTS] == [-1, -2, -1, -1, -2, -2]
    assert operands.OPERAND_AXES["dk.grad_scores"] == -2 and operands.OPERAND_AXES["pv.probs"] == -1


@pytest.fixture
def seventh(monkeypatch):
    monkeypatch.setattr(operands, "LINEAR_TABLE", operands.LINEAR_TABLE + (SEVENTH,))
    return SEVENTH.key


def test_a_seventh_operand_reaches_the_layers_specs_and_shards(seventh):
    fmt = formats.get_format("mxfp8")
    quant = LinearQuant.from_formats({**_unquantized(), seventh: fmt})
    assert quant[seventh].fmt is fmt and quant[seventh].axis == 0 and quant[seventh].name == seventh
    assert quant.sharded("column")[seventh].shard_dim == -1
    assert quant.sharded("row")[seventh].shard_dim is None
    quant.check_shards("column", 48, "fc1")  # blocks along tokens: a split feature dimension is no matter
    tiled = LinearQuant.from_formats({**_unquantized(), seventh: formats.get_format("mxfp8", block_shape=(32, 32))})
    with pytest.raises(ValueError, match="fc1: xgrad.grad_output is quantized by mxfp8_e4m3 in blocks of 32 .* 48"):
        tiled.check_shards("column", 48, "fc1")  # 32 x 32 tiles span the split dimension
    tiled.check_shards("row", 48, "fc1")  # not split in a row-parallel layer


def test_a_seventh_operand_joins_its_gemms_transform_check(seventh):
    hadamard = formats.get_format("mxfp8", hadamard=32)
    lone = LinearQuant.from_formats({**_unquantized(), seventh: hadamard})  # a GEMM of its own: nothing to match
    assert lone[seventh].fmt is hadamard
    with pytest.raises(ValueError, match="wgrad"):
        LinearQuant.from_formats({**_unquantized(), "wgrad.input": hadamard})
    extra = LinearOperand("wgrad", "weight", axis=0, column_shard=0, row_shard=1, captured="backward")
    table = operands.LINEAR_TABLE + (extra,)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(operands, "LINEAR_TABLE", table)
        both = {**_unquantized(table), "wgrad.grad_output": hadamard, "wgrad.input": hadamard}
        with pytest.raises(ValueError, match="wgrad: wgrad.grad_output has hadamard=32 but wgrad.weight"):
            LinearQuant.from_formats(both)  # a third operand of wgrad must share the transform too


def test_a_seventh_operand_reaches_the_what_if_comparison(seventh):
    assert whatif.gemm_operands("fc1", "backward", "pre", "grad_output") == (
        "dgrad.grad_output", "wgrad.grad_output", seventh)
    x = torch.randn(4, 2, 64)
    view, axis = whatif.gemm_view(x, -1, seventh)
    assert view.shape == (8, 64) and axis == 0  # along tokens, on the 2-D view
    row = {"role": "fc1", "operation": "backward", "tensor_name": "grad_output", "operand": seventh}
    assert whatif.tensor_class(row) == f"fc1/backward/grad_output@{seventh}"
