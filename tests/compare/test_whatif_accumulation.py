"""The what-if accumulation statistic (``compare.whatif_accumulation``): each linear GEMM formed from a
step's captured operands, quantized per tensor in FP8 as te-fp8-current does, under a Hopper FP8
tensor core's accumulator (TE's: fprop fast, dgrad and wgrad promoted) against the exact product,
checked against mmaemu's accumulator and numpy's norms; its figure draws within the figure budget."""
import csv
import math
import warnings

import numpy as np
import pytest
import torch

from megatron.quant import formats, position, tensor_saver
from megatron.quant.analysis import figure_render
from megatron.quant.compare import run_whatif, whatif_report
from megatron.quant.tensor_saver import CaptureSite, Operand, SaverConfig

mmaemu = pytest.importorskip("mmaemu", reason="the oracle: pip install mmaemu (the test extra)")

LAYERS = (0, 1, 2)
DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
# gemm -> (a, b) of C = a b^T from X [tokens, in], W [out, in], dY [tokens, out], and its TE accumulation
GEMMS = {"fprop": (lambda x, w, dy: (x, w), "e4m3", "e4m3", True),
         "dgrad": (lambda x, w, dy: (dy, w.t()), "e5m2", "e4m3", False),
         "wgrad": (lambda x, w, dy: (dy.t(), x.t()), "e5m2", "e4m3", False)}


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """fc1's operands of one step in three layers, heavy-tailed so that fast accumulation loses bits."""
    root = tmp_path_factory.mktemp("captures")
    gen = torch.Generator().manual_seed(0)
    tensors = {}
    tensor_saver.configure(SaverConfig(enabled=True, save_dir=str(root), iterations="0"))
    try:
        position.set_iteration(0)
        position.set_microbatch(0, 0)
        for layer in LAYERS:
            site = CaptureSite("linear", "linear", layer, f"decoder.layers.{layer}.mlp.linear_fc1", "fc1", "bf16")
            x = torch.randn(48, 2, 96, generator=gen) * torch.exp(torch.randn(48, 2, 96, generator=gen))
            w = torch.randn(64, 96, generator=gen) * 0.05
            dy = torch.randn(48, 2, 64, generator=gen) * torch.exp(2 * torch.randn(48, 2, 64, generator=gen))
            weight = {"weight": Operand(w, axis=1 if layer else 0)}  # layer 0: the weight captured backward only
            tensor_saver.capture(site, "forward", "pre", {"input": Operand(x, axis=-1), **(weight if layer else {})})
            tensor_saver.capture(site, "backward", "pre", {"grad_output": Operand(dy, axis=-1),
                                                           **({} if layer else weight)})
            tensors[layer] = (x.reshape(-1, 96), w, dy.reshape(-1, 64))
    finally:
        tensor_saver.close()
    return root, tensors


def _oracle(a, b, kinds, fast):
    """mmaemu's accumulator of the per-tensor FP8 operands a, b; (relative error, SQNR) in numpy float64."""
    fmts = [formats.get_format(f"fp8_{kind}", nonfinite="te") for kind in kinds]
    (qa, _), (qb, _) = (fmt.quantize_for_gemm(t.contiguous(), axis=-1) for fmt, t in zip(fmts, (a, b)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        acc = mmaemu.accumulate(qa.to(DTYPES[kinds[0]]), qb.to(DTYPES[kinds[1]]), use_fast_accum=fast, splitk=1,
                                backend="reference")
    exact = qa.double().numpy() @ qb.double().numpy().T
    signal, noise = np.sum(exact ** 2), np.sum((acc.double().numpy() - exact) ** 2)
    return math.sqrt(noise / signal), 10 * math.log10(signal / noise)


def test_the_accumulator_s_error_per_layer_and_gemm_matches_mmaemu(captured, tmp_path):
    root, tensors = captured
    log = []
    args = run_whatif.build_parser().parse_args(["--tensor_dir", str(root), "--output_dir", str(tmp_path),
                                                 "--formats", "te-fp8-current", "mxfp8"])
    run_whatif.run(args, log=log.append)
    folder = tmp_path / whatif_report.FOLDER
    with open(folder / whatif_report.ACCUMULATION_CSV) as handle:
        rows = list(csv.DictReader(handle))
    assert {(int(r["layer_idx"]), r["gemm"]) for r in rows} == {(layer, g) for layer in LAYERS for g in GEMMS}
    assert {r["format"] for r in rows} == {"te-fp8-current"}  # MXFP8 has no Hopper FP8 GEMM
    for row in rows:
        form, kind_a, kind_b, fast = GEMMS[row["gemm"]]
        a, b = form(*tensors[int(row["layer_idx"])])
        assert row["accumulate"] == ("fast" if fast else "promoted") and int(row["k"]) == a.shape[1]
        error, sqnr = _oracle(a, b, (kind_a, kind_b), fast)
        assert float(row["relative_error"]) == pytest.approx(error, rel=1e-9) and error > 0
        assert float(row["sqnr_db"]) == pytest.approx(sqnr, rel=1e-9)
    assert (folder / "accumulation.png").is_file() and "Hopper FP8 accumulation" in (folder / "summary.md").read_text()


def test_the_accumulation_figure_draws_within_the_budget(tmp_path):
    rows = [{"format": name, "role": role, "gemm": gemm, "accumulate": "fast" if gemm == "fprop" else "promoted",
             "layer_idx": layer, "relative_error": 10 ** -(1 + layer / 4), "sqnr_db": 20 * (1 + layer / 4) + offset}
            for name, offset in (("te-fp8-current", 0.0), ("te-fp8-delayed", 0.5))
            for role in ("qkv", "proj", "fc1", "fc2") for gemm in GEMMS for layer in range(4)]
    [job] = whatif_report.accumulation_job(rows)
    outcome = figure_render.render(job, tmp_path, 30)
    assert outcome.clean, outcome.warning() or outcome.error
