"""Catalog and summaries against independent oracles (numpy, the manifests, brute force)."""
import datetime
import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
from capture_fixture import numpy_tensor_stats, tiny_run

from megatron.quant.analysis.captures.catalog import build_catalog, record_from_file_name
from megatron.quant.analysis.captures.loading import (
    CaptureLoadError,
    SummaryOptions,
    load_capture,
    pooled_absmax,
    sample_indices,
    summarize,
)
from megatron.quant.analysis.captures.summary import pooled_moments
from megatron.quant.formats import get_format
from megatron.quant.stats import quant_stats, tensor_stats
from megatron.quant.stats import reference as stats_module


def test_file_name_is_parsed_field_by_field():
    record = record_from_file_name(Path(
        "20250908_095220_0005_iter012_linear_L-1_backward_post_linear_mxfp8_e4m3_rank03"
        "_sample007_grad_input.pt"))
    assert (record.iteration, record.layer_type, record.layer_idx, record.operation,
            record.phase, record.component, record.quant_type, record.rank, record.sample,
            record.tensor_name) == (12, "linear", -1, "backward", "post", "linear",
                                    "mxfp8_e4m3", 3, 7, "grad_input")
    assert record_from_file_name(Path("20250908_092156_0001_attention_L0_forward_hifp8_query.pt")) is None


def test_catalog_lists_what_the_manifests_list(tiny_logs):
    catalog = build_catalog(tiny_logs)
    lines = [json.loads(line) for m in tiny_logs.rglob("manifest-*.jsonl")
             for line in m.read_text().splitlines()]
    assert len(catalog.records) == len(lines) and not catalog.skipped
    stats_only = [r for r in catalog.records if r.path is None]
    assert len(stats_only) == sum(line["file"] is None for line in lines)
    assert {r.role for r in catalog.records} == {"qkv", "fc2", "core_attention"}
    assert all(r.stats and "log2_hist" in r.stats for r in catalog.records)


def test_file_stats_match_numpy_across_tiles(monkeypatch):
    x = (np.random.default_rng(3).standard_normal(10_007) * 3 + 1e3).astype(np.float32)
    x[[5, 17]] = np.nan
    x[[40]] = np.inf
    x[100:130] = 0
    monkeypatch.setitem(stats_module._TILE_ELEMENTS, "cpu", 1024)  # many tiles
    stats = tensor_stats(torch.from_numpy(x))
    log2_counts = stats["log2_hist"]["counts"]
    finite = x[np.isfinite(x)].astype(np.float64)
    assert stats["numel"] == x.size and (stats["nans"], stats["infs"], stats["zeros"]) == (2, 1, 30)
    assert stats["mean"] == pytest.approx(finite.mean(), rel=1e-12)
    assert stats["std"] == pytest.approx(finite.std(), rel=1e-9)
    assert (stats["min"], stats["max"]) == (finite.min(), finite.max())
    assert log2_counts == numpy_tensor_stats(np.where(np.isfinite(x), x, 0))[
        "log2_hist"]["counts"]


def test_bf16_capture_is_read_as_float32(tmp_path):
    values = np.random.default_rng(0).standard_normal((64, 32)).astype(ml_dtypes.bfloat16)
    files = tiny_run(tmp_path, quant_types=("bf16",), layers=(0,), ranks=(0,),
                     stats_iterations=(), manifests=False)
    payload = torch.load(files[0], weights_only=True)
    payload["tensor"] = torch.from_numpy(values.astype(np.float32)).to(torch.bfloat16)
    torch.save(payload, files[0])
    record = build_catalog(tmp_path).records[0]
    summary = summarize(record, SummaryOptions(sample_size=10_000))
    assert summary.sample.dtype == np.float32
    assert np.array_equal(np.sort(summary.sample), np.sort(values.astype(np.float32).ravel()))
    assert summary.stats["std"] == pytest.approx(values.astype(np.float64).std(), rel=1e-9)
    assert summary.record.dtype == "bfloat16"


def test_sample_indices_depend_only_on_the_size():
    first, again = sample_indices(1_000_000, 4096), sample_indices(1_000_000, 4096)
    assert np.array_equal(first, again) and first.size == 4096
    assert first.min() >= 0 and first.max() < 1_000_000 and np.all(np.diff(first) >= 0)
    assert np.array_equal(sample_indices(100, 4096), np.arange(100))


def test_pooled_absmax_is_exact_when_the_grid_is_large_and_keeps_the_max_when_pooling():
    x = np.random.default_rng(1).standard_normal((5, 3, 40)).astype(np.float32)
    assert np.array_equal(pooled_absmax(torch.from_numpy(x), 64), np.abs(x.reshape(15, 40)))
    pooled = pooled_absmax(torch.from_numpy(x), 4)
    assert pooled.shape == (4, 4) and pooled.max() == np.abs(x).max()
    # Every block's value is the max over some of its elements: never above the row-wise max.
    assert np.all(pooled.max(axis=1) <= np.abs(x.reshape(15, 40)).max())


@pytest.mark.parametrize("fmt_name", ["hifp8", "mxfp8", "mxfp4"])
def test_format_view_matches_the_statistics_module(tmp_path, fmt_name):
    tiny_run(tmp_path, quant_types=(fmt_name,), layers=(0,), ranks=(0,), stats_iterations=(),
             quantized_copies=False)
    record = next(r for r in build_catalog(tmp_path).records if r.tensor_name == "input")
    summary = summarize(record, SummaryOptions(format_elements=1 << 20))  # the whole tensor
    tensor = load_capture(record.path)[0]
    expected = quant_stats(tensor, get_format(fmt_name), axis=-1)
    view = summary.format_view
    assert view.applied and view.numel == tensor.numel()
    assert view.overflow_share == pytest.approx(expected["overflow_ratio"], abs=1e-12)
    assert view.underflow_share == pytest.approx(expected["underflow_ratio"], abs=1e-12)
    assert int(view.log2_counts.sum()) == int((tensor != 0).sum())


def test_manifest_statistics_are_used_without_recomputing(tiny_logs):
    record = next(r for r in build_catalog(tiny_logs).records
                  if r.path is not None and r.tensor_name == "weight" and r.format_name)
    summary = summarize(record, SummaryOptions())
    assert summary.stats["mean"] == record.stats["mean"]
    assert summary.quant_source == "saver"
    assert summary.log2_counts.tolist() == record.stats["log2_hist"]["counts"]


def test_pooled_moments_equal_numpy_on_the_concatenation(tiny_logs):
    records = [r for r in build_catalog(tiny_logs).records if r.path is not None][:30]
    summaries = [summarize(r, SummaryOptions()) for r in records]
    values = np.concatenate([load_capture(r.path)[0].numpy().ravel() for r in records])
    moments = pooled_moments(summaries)
    assert moments["numel"] == values.size
    assert moments["mean"] == pytest.approx(values.astype(np.float64).mean(), rel=1e-9, abs=1e-12)
    assert moments["std"] == pytest.approx(values.astype(np.float64).std(), rel=1e-9)
    assert (moments["min"], moments["max"]) == (values.min(), values.max())


@pytest.mark.parametrize("content, reason", [
    (lambda path: path.write_bytes(b"PK\x03\x04 truncated"), "cannot be loaded"),
    (lambda path: torch.save({"tensor": [1.0]}, path), "not a capture"),
    (lambda path: torch.save({"tensor": torch.zeros(0), "metadata": {}}, path), "empty tensor"),
    (lambda path: torch.save({"tensor": torch.zeros(3, dtype=torch.complex64),
                              "metadata": {}}, path), "unsupported dtype"),
    (lambda path: torch.save({"tensor": torch.zeros(3), "metadata": [1]}, path), "metadata is"),
])
def test_unusable_files_raise_a_reason(tmp_path, content, reason):
    path = tmp_path / "x.pt"
    content(path)
    with pytest.raises(CaptureLoadError, match=reason):
        load_capture(path)


def test_weights_only_refuses_pickled_objects(tmp_path):
    path = tmp_path / "x.pt"
    torch.save({"tensor": torch.ones(2), "metadata": {"when": datetime.date(2025, 9, 8)}}, path)
    with pytest.raises(CaptureLoadError, match="weights_only"):
        load_capture(path)
