"""Tests for ksearch.config: the state directory."""

import pytest

from ksearch import config
from ksearch.errors import ConfigError


def test_an_unusable_ksearch_home_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.setenv("KSEARCH_HOME", str(tmp_path / "new" / "home"))
    assert config.home_dir() == tmp_path / "new" / "home" and (tmp_path / "new" / "home").is_dir()
    (tmp_path / "file").write_text("x")
    for bad in (tmp_path / "file", tmp_path / "file" / "below"):  # was FileExistsError / NotADirectoryError
        monkeypatch.setenv("KSEARCH_HOME", str(bad))
        with pytest.raises(ConfigError, match="KSEARCH_HOME"):
            config.home_dir()
