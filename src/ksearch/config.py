"""Environment variables are read here and nowhere else.

- ``KSEARCH_HOME``: where ksearch keeps its state (compile cache, hardware specs, runs); default
  ``~/.cache/ksearch``.
- ``CC`` / ``CXX``: the C / C++ compilers of the cpu target (default ``cc`` / ``c++``).
- ``HOME``: the user's home, hidden from candidates by the evaluation sandbox.
- ``KSEARCH_BUSY_WAIT_S``: how long the judge may wait for a busy machine before timing (`busy_wait_s`).
- ``KSEARCH_CONFIG``: the user's config file (`user_config_file`; API keys under ``[keys]``).
- ``KSEARCH_TOKENIZER``: what counts the tokens of llm backends that report none (`tokenizer_setting`;
  `ksearch.llm.tokens` reads the value).
- The API-key variables (``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``, ... or the one ``--api-key-env`` names):
  `api_key_from_env` (`ksearch.llm.keys` decides which).

Environments handed to child processes (the sandbox's whitelist, the command backend's) are copied from
``os.environ`` where the child starts; those copies are not reads of a setting.
"""

from __future__ import annotations

import os
from pathlib import Path

from ksearch.errors import ConfigError


def home_dir(writable: bool = True) -> Path:
    """ksearch's state directory (created if missing); ``writable=False``: its path as it is, for commands that
    only read (`ksearch runs list`, `ksearch show` work on a read-only home).

    Raises:
        ConfigError: it cannot be created or is not a writable directory.
    """
    path = Path(os.environ.get("KSEARCH_HOME") or Path.home() / ".cache" / "ksearch").expanduser()
    if not writable:
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"ksearch's state directory {path} (KSEARCH_HOME) cannot be created: "
                          f"{e.strerror}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"ksearch's state directory {path} (KSEARCH_HOME) is not writable")
    return path


def user_homes() -> list[str]:
    """The invoking user's home directories (``HOME`` and the password database's), which the evaluation
    sandbox hides from candidates."""
    import pwd

    homes = {os.path.realpath(os.path.expanduser("~"))}
    try:
        homes.add(os.path.realpath(pwd.getpwuid(os.getuid()).pw_dir))
    except KeyError:
        pass
    return sorted(h for h in homes if h not in ("/", ""))


def c_compiler() -> str:
    return os.environ.get("CC") or "cc"


def cxx_compiler() -> str:
    return os.environ.get("CXX") or "c++"


def python_path() -> list[str]:
    """Entries of this process's PYTHONPATH (passed on to evaluation workers, which need the same packages)."""
    return [p for p in (os.environ.get("PYTHONPATH") or "").split(os.pathsep) if p]


def busy_wait_s() -> float:
    """Seconds the judge may wait, per evaluation, for a busy machine to quieten before it times
    (``KSEARCH_BUSY_WAIT_S``, default 30; 0: never wait, only record the load). Raises ConfigError when the value
    is not a number >= 0."""
    raw = os.environ.get("KSEARCH_BUSY_WAIT_S")
    if raw is None or raw == "":
        return 30.0
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise ConfigError(f"KSEARCH_BUSY_WAIT_S must be a number of seconds >= 0, got {raw!r}")
    return value


def user_config_file() -> Path:
    """The user's config file: ``KSEARCH_CONFIG``, else ``~/.config/ksearch/config.toml`` (neither need exist)."""
    return Path(os.environ.get("KSEARCH_CONFIG") or Path.home() / ".config" / "ksearch" / "config.toml").expanduser()


def api_key_from_env(name: str) -> str:
    """The value of the environment variable ``name`` (an API key's: the provider's usual variable or the one
    ``--api-key-env`` names), stripped; "" when it is unset or blank."""
    return os.environ.get(name, "").strip()


def tokenizer_setting() -> str | None:
    """``KSEARCH_TOKENIZER`` (``tiktoken:<encoding>``, ``hf:<path>`` or ``estimate``; `ksearch.llm.tokens` says
    what each means and raises ConfigError for anything else), stripped; None when it is unset or blank."""
    return os.environ.get("KSEARCH_TOKENIZER", "").strip() or None
