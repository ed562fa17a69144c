"""The statistics schema (``stats.record``): every field names functions that exist on both paths, and
a per-block statistic declared in ``BLOCK_KEYS`` alone reaches the capture's records."""
import inspect

import pytest
import torch

from megatron.quant import formats
from megatron.quant.capture.extras import whatif_stats
from megatron.quant.stats import block_scale_stats, record, reference


def test_every_field_names_a_torch_function_that_exists():
    writers = {name for name, value in vars(reference).items() if inspect.isfunction(value)}
    assert set(reference.WRITERS) <= writers
    unknown = [f.name for f in record.FIELDS if f.torch not in reference.WRITERS and f.torch not in reference.TERMS]
    assert not unknown


def test_every_field_names_a_kernel_function_that_exists():
    pytest.importorskip("triton", reason="Triton does not import here: its kernels are not tested")
    from megatron.quant.kernels import stats as kernel_stats

    assert all(name in vars(kernel_stats) for name in kernel_stats.WRITERS)
    unknown = [f.name for f in record.FIELDS if f.kernel not in kernel_stats.WRITERS and f.kernel not in
               kernel_stats.TERMS]
    assert not unknown
    assert kernel_stats.stats_row(kernel_stats.FULL).terms  # the element terms the table names (min_nonzero)


def _blocks_by_hand() -> tuple[torch.Tensor, float]:
    """Three used MX blocks whose E8M0 scales are 2**-8, 2**-127 and 2**-7 (their median 2**-8), one empty."""
    x = torch.zeros(4, 32)
    x[0] = 1.0           # amax 1: 2**(0 - 8)
    x[1] = 2.0 ** -140   # the scale's floor, 2**-127
    x[2, 0] = 3.0        # amax 3: 2**(1 - 8)
    return x, 2.0 ** -8


def test_a_block_statistic_declared_once_reaches_the_records(monkeypatch):
    median = record.BlockKey("scale_median", lambda blocks: float(blocks.scales.median()))
    monkeypatch.setattr(record, "BLOCK_KEYS", (*record.BLOCK_KEYS, median))
    x, expected = _blocks_by_hand()
    fmt = formats.get_format("mxfp8_e4m3")
    _, scale = fmt.quantize_with_scale(x)
    stats = block_scale_stats(x, fmt, -1, scale)
    assert stats["blocks"] == 3 and stats["scale_median"] == expected
    assert whatif_stats(x, fmt, -1, "full")["block_scales"]["scale_median"] == expected
    assert block_scale_stats(torch.zeros(2, 32), fmt, -1, scale[:2])["scale_median"] is None  # no used block


def test_the_per_block_keys_the_report_draws_are_declared():
    from megatron.quant.analysis.captures.block_scales import _PER_LAYER

    assert {key for key, *_ in _PER_LAYER} <= set(record.block_key_names(histograms=False))


def test_the_iteration_view_is_what_the_capture_logs_each_iteration():
    from megatron.quant.capture.summary import IterationSummary

    iteration = record.key_names(view="iteration")
    summary = IterationSummary()
    for value in (1.0, 3.0):
        stats = dict.fromkeys(record.key_names(), value)
        summary.add("fc1", "input", {**stats, "whatif": {"mxfp8": stats}})
    logged = summary.as_dict()
    assert {key for key in logged if key.startswith("quant/")} == {f"quant/fc1/input/{key}" for key in iteration}
    assert {key for key in logged if key.startswith("whatif/")} == {
        f"whatif/mxfp8/fc1/input/{key}" for key in iteration if key in record.key_names(view="whatif")}
    assert set(logged.values()) == {2.0}


def test_a_field_without_its_kernel_term_is_refused_naming_it(monkeypatch):
    pytest.importorskip("triton", reason="Triton does not import here: its kernels are not tested")
    from megatron.quant.kernels import stats as kernel_stats

    field = record.Field("abs_sum", "sum", "full", torch="abs_sum", kernel="abs_sum_term")
    monkeypatch.setattr(record, "FIELDS", (*record.FIELDS, field))
    with pytest.raises(ValueError, match=r"abs_sum \(abs_sum_term\) have no kernel term; add them to TERMS of "
                                         r"megatron/quant/kernels/stats.py"):
        kernel_stats.stats_row(kernel_stats.FULL)
