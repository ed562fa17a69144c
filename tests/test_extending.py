"""docs/extending.md, followed: the guide's registry line is the one in the code, a toy format added
by the same line (NVFP with E3M2 elements) is picked up by the torch path, the kernels (Triton's
interpreter on CPU), the capture statistics and the listings, and every table the guide points at
exists where it says."""
import math
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch

from megatron.quant import formats, kernels
from megatron.quant.formats import registry
from megatron.quant.formats.__main__ import main as formats_cli
from megatron.quant.stats.levels import capture_stats, stats_from_packed

ROOT = Path(__file__).resolve().parents[1]
GUIDE = (ROOT / "docs" / "extending.md").read_text()


def _registry_line() -> str:
    """The registry line of the guide's first step."""
    block = re.search(r"```python\n(.*?)```", GUIDE, re.S).group(1)
    return block.strip()


def test_the_guides_registry_line_is_the_codes():
    assert _registry_line() in (ROOT / "megatron/quant/formats/registry.py").read_text()


def test_every_table_the_guide_points_at_exists():
    pointers = re.findall(r"`(\w+)` (?:of|in) `(megatron/[\w/]+\.py)`", GUIDE)
    assert len(pointers) >= 8, pointers
    for name, path in pointers:
        source = (ROOT / path).read_text()
        assert re.search(rf"^\s*(?:def |class )?{name}\b", source, re.M), f"{name} is not defined in {path}"


@pytest.fixture
def toy_format(monkeypatch):
    """NVFP with E3M2 elements, added by the guide's line with other names."""
    line = _registry_line().replace("nvfp6", "toyfp6").replace("FP6_E2M3", "FP6_E3M2")
    (name, entry), = eval("{" + line + "}", vars(registry)).items()  # noqa: S307 -- the guide's own line
    monkeypatch.setitem(registry._REGISTRY, name, entry)
    return formats.get_format(name)


def _wide(shape, seed) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g) * torch.exp2(torch.randint(-12, 8, (shape[0], 1), generator=g).float())


def test_a_toy_format_reaches_the_torch_path_and_the_listings(toy_format, capsys):
    x = _wide((8, 64), seed=1)
    _, scale = toy_format.quantize_with_scale(x)
    operand, tensor_scale = toy_format.quantize_for_gemm(x)  # element * E4M3 block scale, exact
    block_scale = (scale / tensor_scale).numpy().astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    elements = operand.numpy() / block_scale
    on_grid = elements.astype(ml_dtypes.float6_e3m2fn).astype(np.float32)
    assert np.array_equal(on_grid, elements) and np.abs(elements).max() == 28.0  # E3M2's max, the block amax's
    assert toy_format.needs_tensor_amax and toy_format.block_size == 16
    assert formats_cli(["list"]) == 0 and "toyfp6" in capsys.readouterr().out
    from megatron.quant.compare.whatif import parse_candidates

    assert parse_candidates(["toyfp6"])[0].fmt.name == "toyfp6"


def test_a_toy_format_reaches_the_kernels_and_the_capture(toy_format, monkeypatch):
    pytest.importorskip("triton", reason="Triton does not import here: its kernels are not tested")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from megatron.quant.kernels.triton_format import TritonFormat

    assert kernels.supported(toy_format)
    twin = TritonFormat(toy_format, toy_format)
    x = _wide((8, 64), seed=2)
    assert torch.equal(twin.quantize(x), toy_format.quantize(x))
    q, scale, packed = twin.quantize_with_stats(x, full=True)
    ours = stats_from_packed(packed.tolist(), x.shape, x.dtype, toy_format, "full")
    expected = capture_stats(x, toy_format, level="full")
    assert ours.keys() == expected.keys() and "sqnr_db" in ours
    differ = [key for key in ours if ours[key] != expected[key]
              and not (isinstance(ours[key], float) and math.isnan(ours[key]) and math.isnan(expected[key]))]
    assert not differ, differ
