"""The kernel contract crosses the torch operators as JSON written from its dataclasses' fields
(``formats.frozen_json``): every format's contract comes back equal, and a dataclass that gains a
field travels with it, with nothing written by hand."""
import dataclasses
import json
from typing import Optional

import pytest
import torch

from megatron.quant import formats
from megatron.quant.formats import frozen_json
from megatron.quant.formats.contract import KernelContract, from_json

VARIANTS = [(name, {}) for name in formats.list_formats()] + [
    ("mxfp8", {"block_shape": (32, 32)}), ("nvfp4", {"hadamard": 16}), ("nvfp4", {"row_scaled": True}),
    ("nvfp4", {"four_over_six": "mse"}), ("fp8_e4m3", {"scaling": "block"}), ("bf16", {})]


def _contracts() -> list[KernelContract]:
    built = (formats.get_format(name, **options).kernel_contract for name, options in VARIANTS)
    return [contract for contract in built if contract is not None]


def test_every_contract_comes_back_equal_from_its_json():
    contracts = _contracts()
    assert {c.block_scale.encoding for c in contracts if c.block_scale} == {"e8m0", "fp32", "grid"}
    assert any(c.transform for c in contracts) and any(c.unchanged_dtype for c in contracts)
    assert any(c.tensor_scale and c.tensor_scale.per_row for c in contracts)
    for contract in contracts:
        text = contract.to_json()
        back = from_json(text)
        assert back == contract and back.to_json() == text, contract.name
        # what travels is the dataclasses' fields, nested, and nothing else
        assert json.loads(text)["block_scale"] == (None if contract.block_scale is None
                                                   else dataclasses.asdict(contract.block_scale))


@dataclasses.dataclass(frozen=True)
class _Inner:
    sizes: tuple[int, ...]
    pair: tuple[float, bool] = (1.5, True)


@dataclasses.dataclass(frozen=True)
class _Outer:
    name: str
    inner: Optional[_Inner]
    dtype: Optional[torch.dtype] = None
    later: int | None = None  # a field added later: no codec edit


def test_any_frozen_dataclass_of_plain_fields_round_trips():
    for value in (_Outer("a", _Inner((1, 2, 3)), torch.bfloat16, 4), _Outer("b", None)):
        text = frozen_json.to_json(value)
        back = frozen_json.from_json(_Outer, text)
        assert back == value and isinstance(back.inner.sizes if back.inner else (), tuple)
    assert frozen_json.from_json(_Outer, frozen_json.to_json(_Outer("c", _Inner((7,))))).inner.pair == (1.5, True)


def test_bad_json_names_the_field_or_value():
    with pytest.raises(ValueError, match=r"_Outer: unknown field\(s\) \['colour'\]"):
        frozen_json.from_dict(_Outer, {"name": "a", "inner": None, "colour": 1})
    with pytest.raises(ValueError, match="'torch.nodtype' is not a torch dtype"):
        frozen_json.from_dict(_Outer, {"name": "a", "inner": None, "dtype": "torch.nodtype"})
    with pytest.raises(TypeError, match="a set field"):
        frozen_json.to_json(_Outer("a", None, later={1}))
