"""The analyses' plan: a figure draws the first ``--max_panels`` groups and a note names the rest."""
from megatron.quant.analysis.plans import AnalysisPlan


def test_first_panels_keeps_the_first_groups_and_says_how_many_were_left_out():
    plan = AnalysisPlan()
    assert plan.first_panels("overflow by tensor", {"a": 1, "b": 2, "c": 3}.items(), 2) == [("a", 1), ("b", 2)]
    assert plan.notes == ["overflow by tensor: only the first 2 of 3 groups are drawn (--max_panels; use filters "
                          "to choose others)."]
    assert plan.first_panels("bf16 tensors", iter([1, 2]), 2) == [1, 2] and len(plan.notes) == 1  # all drawn
