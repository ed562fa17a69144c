"""The README's Python example runs as shown: a tensor through four formats, a tiny quantized Llama
capturing one iteration."""
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_readme_python_example_runs(tmp_path):
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## In Python"):]
    [code] = re.findall(r"```python\n(.*?)```", section[:section.index("\n## ", 1)], re.S)
    launcher = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}  # the example starts its own world
    env = {key: value for key, value in os.environ.items() if key not in launcher}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          env={**env, "PYTHONPATH": str(REPO)}, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr  # megatron-core's known start-up notices are hidden
    assert re.findall(r"^(\w+)\s+SQNR\s+[\d.]+ dB$", done.stdout, re.M) == ["hifp8", "mxfp8", "mxfp4", "nvfp4"]
    captured = tmp_path / "my_logs" / "mxfp8"
    assert (captured / "manifest-rank00.jsonl").is_file()
    assert all("_iter001_" in path.name for path in captured.glob("*.pt")) and any(captured.glob("*.pt"))


def test_the_package_sources_compile_without_warnings():
    """An invalid escape sequence is a SyntaxWarning on Python 3.12 (a DeprecationWarning before)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for source in sorted((REPO / "megatron" / "quant").rglob("*.py")):
            if "\\" in (text := source.read_text()):  # only a backslash can start an escape
                compile(text, str(source), "exec")
