"""Recipe tests that build a layer run with megatron-core parallel state at TP=1 (gloo, CPU)."""
from tests._parallel import parallel  # noqa: F401
