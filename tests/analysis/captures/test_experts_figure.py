"""The experts/ figure: each expert's load is the router's token counts summed over micro-batches, and
its error the statistics of its own activations and gradients (fixture statistics: numpy and ml_dtypes)."""
from pathlib import Path

import numpy as np
import torch
from capture_fixture import Capture, e4m3_quant_stats, metadata, write_captures

from megatron.quant.analysis.captures import experts
from megatron.quant.analysis.captures.families import resolve
from megatron.quant.analysis.captures.pipeline import ReportOptions, analysis_input, run_report

COUNTS = ([10, 0, 4, 2], [6, 0, 4, 6])  # two micro-batches; expert 1 never chosen


def _moe_run(root: Path) -> dict[int, dict]:
    """Layer 1's router counts and the fc1 inputs of experts 0, 2 and 3 (their tokens); returns each
    expert's quantization statistics as the fixture measured them."""
    captures, measured = [], {}
    rng = np.random.default_rng(0)
    for sample, counts in enumerate(COUNTS):
        m = metadata(quant_type="mxfp8", layer_type="linear", layer_idx=1, operation="forward", phase="post",
                     tensor_name="tokens_per_expert", role="router", sample=sample, shape=(4,))
        captures.append(Capture(dict(m, module="decoder.layers.1.mlp.router"),
                                torch.tensor(counts, dtype=torch.float32)))
    for expert in (0, 2, 3):
        tokens = sum(counts[expert] for counts in COUNTS)
        x = (rng.standard_normal((tokens, 32)) * 10.0 ** -expert).astype(np.float32)
        m = metadata(quant_type="mxfp8", layer_type="linear", layer_idx=1, operation="forward", phase="pre",
                     tensor_name="input", role="fc1", fmt="mxfp8", shape=x.shape)
        captures.append(Capture(dict(m, module=f"decoder.layers.1.mlp.experts.{expert}.linear_fc1"),
                                torch.from_numpy(x)))
        measured[expert] = e4m3_quant_stats(x)
    write_captures(root, captures)
    return measured


def test_load_and_error_per_expert(tmp_path):
    measured = _moe_run(tmp_path / "logs")
    options = ReportOptions(tmp_path / "logs", tmp_path / "draw", resolve(["experts"]), progress=False)
    [job] = experts.build(analysis_input(options)).figures
    layer = job.payload["layers"][1]
    assert layer["load"] == [16.0, 0.0, 8.0, 8.0]
    assert set(layer["sqnr_db"]) == {0, 2, 3}  # no capture for the expert that got no tokens
    for expert, stats in measured.items():
        assert np.isclose(layer["sqnr_db"][expert], stats["sqnr_db"])
        assert np.isclose(layer["underflow_ratio"][expert], 100 * stats["underflow_ratio"])
    result = run_report(options)
    assert result.figures == ("experts/mxfp8_load_and_error.png",) and not result.failed and not result.warnings


def test_a_dense_run_has_no_experts_section(tiny_logs, tmp_path):
    """Experts do not apply to a dense model: no figure, and no line in the report's "Not drawn" list."""
    options = ReportOptions(tiny_logs, tmp_path / "draw", resolve(["experts"]), progress=False)
    plan = experts.build(analysis_input(options))
    assert not plan.figures and not plan.notes
