"""Download the wheels an offline GPU machine lacks (megatron-core, en_dtypes) into .whl/ and print the line
that installs them there: ``python bench/gpu_wheels.py``. docs/gpu.md says how an offline GPU machine uses it."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench.gpu from the repository

from bench.gpu.wheels import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
