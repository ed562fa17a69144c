"""Layer tests run in one process with megatron-core parallel state at TP=1 (gloo, CPU)."""
from tests._parallel import parallel  # noqa: F401
