"""What must travel to an offline GPU machine as wheels, and the line that installs them there.

The GPU machine assumed (CPython 3.12, x86-64, no network) has torch, Triton, numpy, ml_dtypes, pytest-xdist
and the rest of our dependencies in its image; it lacks megatron-core and en_dtypes, so those travel
as wheels in ``.whl/`` (ignored by git, copied with the checkout). Their own requirements (numpy,
torch, packaging) are in the image. ml_dtypes does not travel: the image has it (0.5 or newer).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Sequence

WHEEL_DIR = ".whl"
PINNED = ("megatron-core==0.19.2", "en_dtypes==0.0.4")
PYTHON_VERSION = "3.12"
# pip matches a manylinux tag exactly: megatron-core 0.19.2 is manylinux_2_28, en_dtypes manylinux2014
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_24_x86_64", "manylinux_2_28_x86_64")
SITE = "/tmp/site"
# the project goes into a target of its own: pip --target skips (or, with --upgrade, replaces) a top-level
# folder that is already there, and megatron/ holds megatron-core's part of the namespace
PROJECT_SITE = "/tmp/quant"


def download_argv(python: str = sys.executable) -> list[str]:
    """``pip download`` of the pinned wheels for the device's Python, into WHEEL_DIR."""
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    return [python, "-m", "pip", "download", "--only-binary=:all:", "--no-deps", "--python-version", PYTHON_VERSION,
            "--implementation", "cp", *platforms, "-d", WHEEL_DIR, *PINNED]


def install_line(site: str = SITE, project_site: str = PROJECT_SITE) -> str:
    """The device command's first line, from the repository root: the wheels, then this working tree
    (no index, no dependencies; the image's setuptools builds it), then PYTHONPATH (the repository root
    last: bench.gpu imports from it)."""
    pip = "python3 -m pip install -q --no-index --no-deps --no-compile"
    return (f"{pip} --target {site} {WHEEL_DIR}/*.whl && {pip} --no-build-isolation --target {project_site} . "
            f"&& export PYTHONPATH={site}:{project_site}:$PWD || exit")


def main(argv: Sequence[str] | None = None, repo: Path = Path(__file__).resolve().parents[2]) -> int:
    """Download the wheels into ``repo``'s WHEEL_DIR and print the install line; 2 with one line when
    pip fails (offline, an index without them)."""
    argparse.ArgumentParser(prog="python bench/gpu_wheels.py", description=f"Download {', '.join(PINNED)} for "
                            f"CPython {PYTHON_VERSION} into {WHEEL_DIR}/ and print the line that installs them on "
                            f"the GPU machine.").parse_args(argv)
    result = subprocess.run(download_argv(), cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0:
        lines = [line for line in result.stdout.splitlines() if line.strip()]
        reason = next((line for line in reversed(lines) if "ERROR" in line), lines[-1] if lines else "no output")
        print(f"gpu_wheels: error: pip download failed (status {result.returncode}): {reason.strip()[:300]}",
              file=sys.stderr)
        return 2
    print(f"{result.stdout.rstrip()}\n\non the device, from the repository root (carry ['{WHEEL_DIR}']):\n"
          f"{install_line()}")
    return 0
