import pytest


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory, monkeypatch):
    """Every test gets its own KSEARCH_HOME, shared within the session for the hardware spec cache."""
    home = tmp_path_factory.getbasetemp() / "ksearch-home"
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("KSEARCH_HOME", str(home))
