import pytest
from _extending_guide import GUIDE_FORMAT, guide_format


@pytest.fixture
def name(request, monkeypatch) -> str:
    """A format's name (``indirect`` parameter): the parameter, or the format docs/extending.md adds
    with a new element grid, registered for this test only."""
    return guide_format(monkeypatch) if request.param == GUIDE_FORMAT else request.param
