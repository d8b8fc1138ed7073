"""Tests for ksearch.config: the state directory, the user config file, API-key variables; no other module reads a
KSEARCH_ variable."""

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


def test_the_user_config_file_and_api_key_variables_are_read_here(tmp_path, monkeypatch):
    monkeypatch.setenv("KSEARCH_CONFIG", str(tmp_path / "c.toml"))
    assert config.user_config_file() == tmp_path / "c.toml"
    monkeypatch.delenv("KSEARCH_CONFIG")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert config.user_config_file() == tmp_path / ".config" / "ksearch" / "config.toml"
    monkeypatch.setenv("MY_KEY", "  sk-1 \n")
    monkeypatch.setenv("BLANK_KEY", " ")
    monkeypatch.delenv("NO_KEY", raising=False)
    assert (config.api_key_from_env("MY_KEY"), config.api_key_from_env("BLANK_KEY"),
            config.api_key_from_env("NO_KEY")) == ("sk-1", "", "")


def test_no_module_but_config_reads_a_ksearch_variable():
    """``os.environ.get("KSEARCH_...")``, ``os.environ["KSEARCH_..."]`` and ``os.getenv("KSEARCH_...")`` appear in
    ksearch.config only (the variables are documented there)."""
    import ast
    from pathlib import Path

    src = Path(config.__file__).parent
    reads = []
    for f in sorted(src.rglob("*.py")):
        if f.name == "config.py" and f.parent == src:
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            key = None
            if isinstance(node, ast.Call) and node.args and ast.unparse(node.func) in (
                    "os.environ.get", "os.getenv", "environ.get", "getenv"):
                key = node.args[0]
            elif isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("os.environ", "environ") \
                    and isinstance(node.ctx, ast.Load):
                key = node.slice
            if isinstance(key, ast.Constant) and str(key.value).startswith("KSEARCH_"):
                reads.append(f"{f.relative_to(src)}:{node.lineno} {key.value}")
    assert reads == []
