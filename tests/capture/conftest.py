"""Each capture test ends its own saver session, so none leaks into the next."""
import pytest

from megatron.quant import tensor_saver


@pytest.fixture(autouse=True)
def _close_saver_session():
    yield
    tensor_saver.close()
