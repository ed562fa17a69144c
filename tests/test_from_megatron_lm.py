"""docs/from-megatron-lm.md's worked example runs as shown: the stock Megatron-LM Llama 3 launch line, sized
down, trains under the trainer with its notices and captures; the report command draws its page."""
import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs" / "from-megatron-lm.md"


def _example_commands() -> list[str]:
    text = GUIDE.read_text()
    section = text[text.index("## A worked example"):]
    return re.findall(r"```bash\n(.*?)```", section, re.S)


def test_the_guide_links_from_the_readme_and_names_the_release_it_was_read_from():
    assert "](docs/from-megatron-lm.md)" in (REPO / "README.md").read_text()
    assert "core_v0.19.0" in GUIDE.read_text()
    assert len(_example_commands()) == 2


@pytest.mark.slow
def test_the_worked_example_runs_as_shown(tmp_path):
    """Trains the sized-down line for two iterations (tiny), then draws the quick report."""
    (tmp_path / "script").symlink_to(REPO / "script")
    drop = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"} | {
        name for name in os.environ if name.startswith(("CUSTOM_QUANT_", "TENSOR_SAVE", "TENSOR_INSPECT"))}
    env = {key: value for key, value in os.environ.items() if key not in drop}
    train, report = _example_commands()
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", train], cwd=tmp_path, capture_output=True, text=True,
                          env={**env, "PYTHONPATH": str(REPO)}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    notices = re.findall(r"^megatron-quant-train: notice: (--[\w-]+)", done.stdout, re.M)
    assert {"--use-mcore-models", "--apply-layernorm-1p", "--sequence-parallel", "--fp8-format"} <= set(notices)
    assert "quantization te-fp8-delayed" in done.stdout
    assert [path.name for path in (tmp_path / "tensor_logs").iterdir()] and any(
        "_iter002_" in path.name for path in (tmp_path / "tensor_logs").rglob("*.pt"))
    assert (tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", report], cwd=tmp_path, capture_output=True, text=True,
                          env={**env, "PYTHONPATH": str(REPO)}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "draw" / "index.html").is_file()
