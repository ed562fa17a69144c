"""docs/extending.md, followed: the guide's registry line is the one in the code, a toy format added
by the same line (NVFP with E3M2 elements) is picked up by the torch path, the kernels (Triton's
interpreter on CPU), the capture statistics and the listings; a toy statistic added by the guide's
steps (the sum of |x| and its mean) by the torch path, the kernels, the capture's manifest and the
report; and every table the guide points at exists where it says."""
import csv
import json
import math
import re
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch

from megatron.quant import formats, kernels, position, tensor_saver
from megatron.quant.capture.extras import whatif_stats
from megatron.quant.formats import registry
from megatron.quant.formats.__main__ import main as formats_cli
from megatron.quant.stats import packing, record, reference
from megatron.quant.stats.levels import capture_stats, stats_from_packed
from megatron.quant.stats.reference import tensor_stats

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


# --- an operand statistic ------------------------------------------------------------------------

def _statistic_steps() -> tuple[str, str, str, str]:
    """The code of the guide's statistic recipe: the field, the torch term, the kernel term, the key."""
    section = GUIDE[GUIDE.index("## An operand statistic"):GUIDE.index("## A kernel")]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    field, torch_term, kernel_term, key = (textwrap.dedent(block).strip() for block in blocks)
    return field, torch_term, kernel_term, key


def _mean_abs(total, numel, nans, infs):
    finite = numel - int(nans) - int(infs)
    return total / finite if finite else None


@pytest.fixture
def toy_statistic(monkeypatch):
    """The sum of |x| over the finite elements (a field) and its mean (a key), added by the guide's own
    lines; the kernels' term is added by ``toy_kernel_term``."""
    field, torch_term, _, key = _statistic_steps()
    monkeypatch.setattr(record, "FIELDS", (*record.FIELDS, *eval(f"({field})", vars(record))))  # noqa: S307
    (name, term), = eval("{" + torch_term + "}", vars(reference)).items()  # noqa: S307 -- the guide's own line
    monkeypatch.setitem(reference.TERMS, name, term)
    monkeypatch.setattr(record, "KEYS", (*record.KEYS, *eval(f"({key})", {**vars(record), "_mean_abs": _mean_abs})))


@pytest.fixture
def toy_kernel_term(toy_statistic, monkeypatch):
    """The guide's kernel term, which lives in a module of its own (a Triton function reads ``tl``
    from its module)."""
    pytest.importorskip("triton", reason="Triton does not import here: its kernels are not tested")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from megatron.quant.kernels import stats as kernel_stats
    from tests._toy_kernel_term import abs_sum_term

    assert _statistic_steps()[2] in (ROOT / "tests" / "_toy_kernel_term.py").read_text()
    monkeypatch.setitem(kernel_stats.TERMS, "abs_sum_term", abs_sum_term)


def _integers(shape, seed) -> torch.Tensor:
    """Small integers (any order of summing their magnitudes is exact) with a NaN and an Inf."""
    x = torch.randint(-1000, 1001, shape, generator=torch.Generator().manual_seed(seed)).float()
    x.view(-1)[:2] = torch.tensor([math.nan, math.inf])
    return x


def _oracle_mean_abs(x: torch.Tensor) -> float:
    finite = [abs(v) for v in x.flatten().tolist() if math.isfinite(v)]
    return math.fsum(finite) / len(finite)


def test_a_toy_statistic_reaches_the_torch_path(toy_statistic):
    x = _integers((16, 64), seed=3)
    assert tensor_stats(x)["mean_abs"] == _oracle_mean_abs(x)
    fmt = formats.get_format("mxfp8_e4m3")
    assert capture_stats(x, fmt, level="full")["mean_abs"] == _oracle_mean_abs(x)
    counts = capture_stats(x, fmt, level="counts")
    assert "mean_abs" in counts and counts["mean_abs"] is None  # it reads a full-level field
    assert tensor_stats(x[:0])["mean_abs"] is None
    assert whatif_stats(x, formats.get_format("nvfp4"), -1, "full")["mean_abs"] == _oracle_mean_abs(x)  # its view


def test_a_toy_statistic_reaches_the_kernels(toy_kernel_term):
    from megatron.quant.kernels.triton_format import TritonFormat

    for name in ("nvfp4", "fp8_e4m3"):  # a block kernel and the elementwise one
        fmt = formats.get_format(name)
        x = _integers((8, 64), seed=4)
        q, scale, packed = TritonFormat(fmt, fmt).quantize_with_stats(x, full=True)
        assert packed.numel() == packing.layout().width
        assert torch.equal(packed, reference.pack_stats(x, fmt, q=q, scale=scale))
        assert stats_from_packed(packed.tolist(), x.shape, x.dtype, fmt, "full")["mean_abs"] == _oracle_mean_abs(x)


def test_a_toy_statistic_reaches_the_manifest_and_the_report(toy_statistic, capture_session, tmp_path):
    from megatron.quant.analysis.captures.families import resolve
    from megatron.quant.analysis.captures.pipeline import ReportOptions, run_report
    from megatron.quant.tensor_saver import CaptureSite, Operand

    root = tmp_path / "tensor_logs"
    capture_session(root, iterations="0", mode="stats")
    position.set_iteration(0)
    position.set_microbatch(0, 0)
    x = _integers((8, 64), seed=5)
    site = CaptureSite("linear", "linear", 0, "decoder.layers.0.mlp.linear_fc1", "fc1", "mxfp8")
    tensor_saver.capture(site, "forward", "pre", {"input": Operand(x, formats.get_format("mxfp8_e4m3"))})
    tensor_saver.close()
    manifest, = root.rglob("manifest-*.jsonl")
    stats = json.loads(manifest.read_text().splitlines()[0])["metadata"]["stats"]
    assert stats["mean_abs"] == _oracle_mean_abs(x)
    out = tmp_path / "report"
    result = run_report(ReportOptions(tensor_dir=root, output_dir=out, analyses=resolve(["statistics"])))
    assert not result.failed
    with (out / "statistics" / "tensor_summary.csv").open() as handle:
        row, = csv.DictReader(handle)
    assert float(row["mean_abs"]) == _oracle_mean_abs(x)


def test_a_field_without_its_terms_is_refused_naming_it(monkeypatch):
    field = record.Field("abs_sum", "sum", "full", torch="abs_sum", kernel="abs_sum_term")
    monkeypatch.setattr(record, "FIELDS", (*record.FIELDS, field))
    with pytest.raises(ValueError, match="'abs_sum' has no torch term; add one to TERMS of megatron/quant/stats"):
        reference.pack_stats(torch.ones(4))
