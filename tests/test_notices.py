"""The training entry point hides megatron-core's known start-up notices, counts them for the
start line, and lets every other warning through; the report and compare_formats show none of
them, nor does `recipes show` (in a fresh interpreter: pytest catches warnings and log records itself)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from megatron.quant import notices

SCRIPT = """
import logging, warnings
from megatron.quant import notices
notices.hide_known()
warnings.warn("Apex is not installed. Falling back to Torch Norm")
warnings.warn("Transformer Engine and Apex are not installed. Falling back to Torch optimizers.")
warnings.warn("something new and unknown")
dataset = logging.getLogger("megatron.core.datasets.gpt_dataset")
dataset.warning("Unable to save MockGPTDataset indexes because path_to_cache is None")
dataset.warning("a dataset problem nobody knows")
# megatron-core 0.19's, word for word
logging.getLogger("megatron.core.models.gpt.gpt_model").warning(
    "GPTModel IS DEPRECATED. GPTModel is only accepting critical bug fixes, no new features. Please reference the "
    "migration guide `docs/user-guide/hybrid-model-migration.md` for details on how to use `HybridModel`")
logging.getLogger("megatron.core.dist_checkpointing.strategies.torch").warning(
    "MCore's async save is deprecated and will be removed in the future releases. Please, use NVRx async solution "
    "by setting `async_strategy` to `nvrx`.")
print(notices.describe_hidden())
"""


def test_known_notices_are_counted_not_shown_and_others_still_show():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True)
    assert "something new and unknown" in done.stderr and "a dataset problem nobody knows" in done.stderr
    assert "Apex" not in done.stderr and "path_to_cache" not in done.stderr and "DEPRECATED" not in done.stderr
    assert "async save" not in done.stderr
    assert done.stdout.strip() == ("(5 known megatron-core notices hidden: Transformer Engine/Apex fallbacks x2, "
                                   "mock-data index cache x1, GPTModel deprecation x1, async-save deprecation x1)")


REPO = Path(__file__).resolve().parents[1]
# The report (python -m megatron.quant.analysis, the visualization scripts) and compare_formats import
# megatron-core through the capture catalog; --help imports everything and draws nothing. `recipes show`
# of a precision file imports it (megatron-core's RecipeConfig). (command, what its output holds)
ENTRY_POINTS = (([sys.executable, "-m", "megatron.quant.analysis", "--help"], "--tensor_dir"),
                ([sys.executable, str(REPO / "script" / "compare_formats.py"), "--help"], "--tensor_dir"),
                ([sys.executable, "-m", "megatron.quant.recipes", "show",
                  str(REPO / "examples" / "precision" / "te-mixed.yaml")], "accumulate"))


@pytest.mark.parametrize("command, shown", ENTRY_POINTS, ids=["report", "compare_formats", "recipes_show"])
def test_report_compare_formats_and_recipes_show_print_no_known_notice(command, shown):
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, check=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (
                              str(REPO), os.environ.get("PYTHONPATH"))))})
    assert shown in done.stdout
    assert not [line for line in done.stderr.splitlines()
                if any(notice.message.search(line) for notice in notices.KNOWN)], done.stderr
