"""Integer ranges stay ranges: a capture filter or a report filter of a million (or 10^11)
indices costs a few integers, never a list of its members."""
import tracemalloc

import pytest

from megatron.quant.capture.config import SaverConfig

WIDE = "0-999999"  # small enough that expanding it (the old way) costs tens of MB, not all memory


def _peak_bytes(function) -> tuple[object, int]:
    tracemalloc.start()
    try:
        result = function()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("variable", ["TENSOR_SAVER_ITERATION", "TENSOR_SAVE_LAYERS", "TENSOR_SAVE_RANKS",
                                      "TENSOR_SAVE_MICROBATCHES"])
def test_capture_ranges_are_not_expanded(variable):
    config, peak = _peak_bytes(lambda: SaverConfig.from_env({variable: WIDE}))
    assert peak < 1_000_000, peak
    chosen = {"TENSOR_SAVER_ITERATION": config.iterations and config.iterations.members}.get(variable) or \
        getattr(config, variable.removeprefix("TENSOR_SAVE_").lower())
    assert 999999 in chosen and 1000000 not in chosen and str(chosen) == WIDE


def test_a_huge_capture_range_is_checked_against_the_run_without_listing_it():
    from megatron.quant.settings.selectors import IndexSet  # code that would list the range fails here, not OOM

    assert isinstance(SaverConfig.from_env({"TENSOR_SAVE_LAYERS": "0-3"}).layers, IndexSet)
    config = SaverConfig.from_env({"TENSOR_SAVE_ENABLED": "1", "TENSOR_SAVE_LAYERS": "0-99999999999",
                                   "TENSOR_SAVER_ITERATION": "5-99999999999"})
    with pytest.warns(RuntimeWarning, match=r"^TENSOR_SAVE_LAYERS: 2-99999999999 ignored, the run has 2 "):
        config.check_selectors(num_layers=2, world_size=1)
    window = config.iterations.restricted_to(0, 10)
    assert list(window.members) == [5, 6, 7, 8, 9] and config.iterations.last() == 99999999999


def test_report_filter_ranges_are_not_expanded(tmp_path):
    from megatron.quant.analysis.cli import build_parser, capture_filter

    parser = build_parser("report", ("quick",))
    chosen, peak = _peak_bytes(lambda: capture_filter(parser.parse_args(
        ["--iterations", WIDE, "--layers", "-1", "0-999999", "--ranks", "3"])))
    assert peak < 1_000_000, peak
    assert chosen.describe() == f"layers=-1-999999; iterations={WIDE}; ranks=3"


def test_a_filter_value_no_capture_has_is_named_as_a_range():
    from megatron.quant.analysis.captures.catalog import CaptureRecord
    from megatron.quant.analysis.captures.selection import CaptureFilter, FilterError
    from megatron.quant.settings.selectors import IndexSet

    record = CaptureRecord(None, "bf16", "linear", 0, "forward", "pre", "linear", "input", 3, 0)
    with pytest.raises(FilterError, match=r"^--iterations 0-2,4-99999999999: no capture has these values; "
                                          r"available: 3$"):
        CaptureFilter(iterations=IndexSet.of([(0, 99999999999)])).validate([record])
