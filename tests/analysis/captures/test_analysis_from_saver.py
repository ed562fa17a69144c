"""The report reads what the real tensor_saver writes (files, manifests, statistics)."""
from pathlib import Path

import pytest
import torch

from megatron.quant import position, tensor_saver
from megatron.quant.analysis.captures.families import resolve
from megatron.quant.analysis.captures.pipeline import ReportOptions, run_report
from megatron.quant.formats import get_format
from megatron.quant.tensor_saver import CaptureSite, Operand


@pytest.fixture
def saver_logs(tmp_path, capture_session) -> Path:
    root = tmp_path / "tensor_logs"
    capture_session(root, iterations="0-2", mode="full", save_quantized=True)
    generator = torch.Generator().manual_seed(0)
    for quant_type, fmt in (("mxfp8", get_format("mxfp8")), ("bf16", None)):
        for iteration in range(3):
            position.set_iteration(iteration)
            position.set_microbatch(0, 0)
            for layer in range(2):
                site = CaptureSite("linear", "linear", layer,
                                   f"decoder.layers.{layer}.mlp.linear_fc1", "fc1", quant_type)
                x = torch.randn(8, 2, 64, generator=generator)
                w = torch.randn(128, 64, generator=generator) * 0.02
                tensor_saver.capture(site, "forward", "pre",
                                     {"input": Operand(x, fmt), "weight": Operand(w, fmt)})
                tensor_saver.capture(site, "forward", "post", {"output": x @ w.T})
    tensor_saver.close()
    return root


def test_report_from_the_real_saver(saver_logs, tmp_path):
    out = tmp_path / "draw"
    result = run_report(ReportOptions(
        tensor_dir=saver_logs, output_dir=out,
        analyses=resolve(["quick", "statistics", "exponents", "overflow", "trends"])))
    assert not result.failed and not result.warnings and not result.skipped
    rows = (out / "statistics" / "tensor_summary.csv").read_text().splitlines()[1:]
    assert len(rows) == 2 * 3 * 2 * 3  # quant types x iterations x layers x tensors
    assert all(row.endswith(",saver") for row in rows if ",mxfp8_e4m3," in row)
    drawn = set(result.figures)
    assert {"quick_analysis.png", "exponent_analysis/mxfp8.png",
            "overflow_analysis/overflow_overview.png", "training_trends/mxfp8.png",
            "training_trends/bf16.png", "statistics/block_scales.png"} <= drawn
    assert "quantized copies (not counted above): 12" in (out / "tensor_stats.txt").read_text()
