"""API keys for the openai and anthropic backends: from the environment or the user's config file.

Where a key comes from, first found wins:

1. ``api_key_env``, when given: the named environment variable (and nothing else: asking for a variable that
   is unset is an error, not a fallback).
2. The provider's usual variable: ``ANTHROPIC_API_KEY`` (anthropic backend), ``GEMINI_API_KEY`` or
   ``GOOGLE_API_KEY`` (a base URL at googleapis.com), ``OPENROUTER_API_KEY`` (openrouter.ai),
   ``OPENAI_API_KEY`` (OpenAI's API: no base URL, or api.openai.com).
3. The config file, ``$KSEARCH_CONFIG`` or ``~/.config/ksearch/config.toml``, table ``[keys]``: the provider's
   name (``openai``, ``anthropic``, ``gemini``, ``openrouter``, ``local``) or the endpoint's host name::

       [keys]
       openai = "sk-..."
       anthropic = "sk-ant-..."
       "api.together.xyz" = "..."

4. A local endpoint (localhost, 127.0.0.1, ::1, 0.0.0.0, *.localhost) gets a dummy key: vLLM, Ollama and
   llama.cpp's server accept any key unless started with one.

An OpenAI-compatible endpoint elsewhere (Together, Groq, a remote vLLM...) is not sent ``OPENAI_API_KEY``: name
its variable with ``api_key_env`` or give its host in ``[keys]``; a local one is not sent a real key unless
asked for. A key is returned to the caller, which hands it to the provider's SDK; it is never logged, never
part of an error message, and never stored in a run (the run keeps only ``api_key_env``, a variable's name).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from urllib.parse import urlparse

from ksearch import config
from ksearch.errors import ConfigError

#: the key handed to local endpoints that need none
LOCAL_DUMMY_KEY = "ksearch-local-no-key"

_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "[::1]"}


def config_path() -> Path:
    """``$KSEARCH_CONFIG`` or ``~/.config/ksearch/config.toml`` (which need not exist; `config.user_config_file`)."""
    return config.user_config_file()


def _host(base_url: str | None) -> str:
    if not base_url:
        return ""
    parsed = urlparse(base_url if "//" in base_url else "//" + base_url)
    return (parsed.hostname or "").lower()


def is_local(base_url: str | None) -> bool:
    """True for an endpoint on this machine (localhost, 127.0.0.1, ::1, 0.0.0.0, *.localhost)."""
    host = _host(base_url)
    return host in _LOCAL_HOSTS or host.endswith(".localhost") or host.startswith("127.")


def provider_of(kind: str, base_url: str | None) -> str:
    """anthropic | gemini | openrouter | local | openai | other: whose key a (kind, base URL) needs."""
    host = _host(base_url)
    if kind == "anthropic":
        return "local" if is_local(base_url) else "anthropic"
    if kind != "openai":
        raise ConfigError(f"backend {kind!r} takes no API key (only openai and anthropic do)")
    if not host or host == "api.openai.com":
        return "openai"
    if host == "googleapis.com" or host.endswith(".googleapis.com"):
        return "gemini"
    if host == "openrouter.ai" or host.endswith(".openrouter.ai"):
        return "openrouter"
    if is_local(base_url):
        return "local"
    return "other"


_ENV_VARS = {
    "openai": ("OPENAI_API_KEY",),
    "anthropic": ("ANTHROPIC_API_KEY",),
    "gemini": ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
    "openrouter": ("OPENROUTER_API_KEY",),
    "local": (),
    "other": (),
}


def _config_keys() -> tuple[dict, Path]:
    path = config_path()
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}, path
    except OSError as e:
        raise ConfigError(f"ksearch config file {path} cannot be read: {e.strerror}") from None
    try:
        doc = tomllib.loads(raw.decode("utf-8", errors="replace"))
    except tomllib.TOMLDecodeError as e:
        # the parser's message names a line and column, never the file's text
        raise ConfigError(f"ksearch config file {path} is not valid TOML: {e}") from None
    keys = doc.get("keys", {})
    if not isinstance(keys, dict):
        raise ConfigError(f"ksearch config file {path}: [keys] must be a table of name = \"key\"")
    return keys, path


def resolve_api_key(kind: str, base_url: str | None = None, api_key_env: str | None = None) -> str:
    """The API key for backend ``kind`` (openai | anthropic) at ``base_url`` (see the module docstring).

    Raises:
        ConfigError: no key was found; the message names the variables to set and the config file (never a
            key's value).
    """
    provider = provider_of(kind, base_url)
    if api_key_env:
        value = config.api_key_from_env(api_key_env)
        if value:
            return value
        raise ConfigError(f"the environment variable {api_key_env} (--api-key-env) is not set or empty")
    for var in _ENV_VARS[provider]:
        value = config.api_key_from_env(var)
        if value:
            return value
    keys, path = _config_keys()
    host = _host(base_url)
    for name in (provider, host):
        value = keys.get(name) if name else None
        if isinstance(value, str) and value.strip():
            return value.strip()
    if provider == "local":
        return LOCAL_DUMMY_KEY
    where = f"the endpoint {base_url}" if base_url else f"{provider}'s API"
    table = f"under [keys] in {path} ($KSEARCH_CONFIG names another config file)"
    if provider == "other":
        hint = f"name the variable holding its key with --api-key-env, or add \"{host}\" = \"...\" {table}"
    else:
        hint = (f"set {' or '.join(_ENV_VARS[provider])}, name another variable with --api-key-env, "
                f"or add {provider} = \"...\" {table}")
    raise ConfigError(f"no API key for {where} ({kind} backend): {hint}")
