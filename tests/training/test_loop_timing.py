"""The console's speed columns: a captured iteration shows its own time, and the interval line the
speed of the other iterations of its window (not one average copied onto both lines)."""
import pytest

from megatron.quant.training.loop import iterations_run, window_seconds


def test_a_captured_iteration_is_timed_apart_from_its_window():
    rows = [{"capture": {}, "seconds": 0.1}, {"capture": {"capture/records": 72}, "seconds": 3.0},
            {"capture": {}, "seconds": 0.1}, {"capture": {}, "seconds": 0.1}]
    # the window took 6 s: 3 s the capture, the other three share the rest
    assert window_seconds(rows, 6.0) == pytest.approx([1.0, 3.0, 1.0, 1.0])
    assert window_seconds(rows[:2], 2.5) == pytest.approx([1.25, 3.0])  # clocks that disagree: the window mean
    assert window_seconds(rows[1:2], 3.2) == pytest.approx([3.0])


def test_iterations_are_numbered_as_printed():
    assert iterations_run(0, 24) == range(1, 25)  # "iteration 1/24" .. "iteration 24/24"
    assert iterations_run(15, 24) == range(16, 25)  # resumed from the checkpoint saved after iteration 15
