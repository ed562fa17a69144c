"""The GPU check in one command: ``python bench/gpu_check.py [--stage NAME ...] [--out DIR]
[--budget-s N] [--dry-run]``. What it runs and how to run it on a GPU machine: docs/gpu.md."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the stages import bench.gpu from the repository

from bench.gpu.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
