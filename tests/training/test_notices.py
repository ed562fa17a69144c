"""The training entry point hides megatron-core's known start-up notices, counts them for the
start line, and lets every other warning through (in a fresh interpreter: pytest catches
warnings and log records itself)."""
import subprocess
import sys

SCRIPT = """
import logging, warnings
from megatron.quant.training import notices
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
