"""Token counts for the calls whose backend reports none (command, queue, a compatible server that omits
``usage``): a real tokenizer where one is installed, else an estimate, and every record says which
(`ksearch.llm.base.LLMCall.usage_counted_by`).

``KSEARCH_TOKENIZER`` (read by `ksearch.config.tokenizer_setting`) picks the counter:

- ``tiktoken:<encoding>`` (e.g. ``tiktoken:o200k_base``, the encoding of GPT-4o, GPT-4.1, GPT-5 and the o-series;
  ``tiktoken:cl100k_base`` for GPT-4 and GPT-3.5): OpenAI's tiktoken. Loaded from tiktoken's own cache only
  (``TIKTOKEN_CACHE_DIR``, else ``<tmp>/data-gym-cache``): ksearch never lets it download its BPE file, so a
  run never waits on the network for a count. Load it once where the network is reachable
  (``python -c "import tiktoken; tiktoken.get_encoding('o200k_base')"``).
- ``hf:<path>``: a Hugging Face ``tokenizers`` tokenizer: a ``tokenizer.json`` file, or a local directory that
  holds one (a downloaded model's).
- ``estimate``: ~4 characters a token (at least 1 per side of a call).

Unset: ``tiktoken:o200k_base`` when tiktoken is installed and the encoding loads from its cache, else the
estimate. No tokenizer here counts Claude's or Gemini's tokens exactly (neither vendor ships one): another
model's tokenizer gives a nearer figure than the estimate, not theirs.

A call's count: input, the sum of its messages' contents; output, the reply's. The few tokens a chat template
adds per message are not counted.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from ksearch.errors import ConfigError
from ksearch.llm.base import ESTIMATE, Message, Usage

#: the tiktoken encoding taken when KSEARCH_TOKENIZER is unset (and loads from the cache)
DEFAULT_TIKTOKEN = "o200k_base"
#: characters per token of the estimate
CHARS_PER_TOKEN = 4
_HELP = ("KSEARCH_TOKENIZER takes tiktoken:<encoding> (e.g. tiktoken:o200k_base), hf:<tokenizer.json or a local "
         "directory holding one> or estimate")


class TokenCounter(Protocol):
    """Counts the tokens of a text. ``name``: what `LLMCall.usage_counted_by` records."""

    name: str

    def count(self, text: str) -> int: ...


class Estimate:
    """~`CHARS_PER_TOKEN` characters a token."""

    name = ESTIMATE

    def count(self, text: str) -> int:
        return round(len(text) / CHARS_PER_TOKEN)


class _Encoded:
    """A real tokenizer: ``encode`` maps a text to its token ids."""

    def __init__(self, name: str, encode: Callable[[str], list]):
        self.name = name
        self._encode = encode

    def count(self, text: str) -> int:
        return len(self._encode(text)) if text else 0

    def __repr__(self) -> str:
        return f"TokenCounter({self.name!r})"


def count_usage(counter: TokenCounter, messages: list[Message], reply: str) -> Usage:
    """The tokens of a call as ``counter`` counts them: input, the messages' contents; output, the reply (the
    estimate counts at least 1 token per side, as a call always costs something)."""
    inp = sum(counter.count(m.content) for m in messages)
    out = counter.count(reply)
    if counter.name == ESTIMATE:
        inp, out = max(1, inp), max(1, out)
    return Usage(input_tokens=inp, output_tokens=out)


def counter_for(spec: str | None) -> TokenCounter:
    """The counter ``spec`` names (the module docstring lists the forms); None: the default.

    Raises:
        ConfigError: an unknown form, a tokenizer that is not installed, an encoding that is unknown or not in
            tiktoken's cache, a tokenizer file that is missing or does not load (the message shows the value).
    """
    if spec is None or not spec.strip():
        return default_counter()
    spec = spec.strip()
    kind, sep, arg = spec.partition(":")
    arg = arg.strip()
    if kind == ESTIMATE and not sep:
        return Estimate()
    if kind == "tiktoken" and arg:
        return tiktoken_counter(arg)
    if kind == "hf" and arg:
        return hf_counter(arg)
    raise ConfigError(f"KSEARCH_TOKENIZER={spec!r} is not a tokenizer: {_HELP}")


def default_counter() -> TokenCounter:
    """tiktoken's `DEFAULT_TIKTOKEN` when tiktoken is installed and the encoding loads from its cache, else the
    estimate (never raises, never touches the network)."""
    try:
        return tiktoken_counter(DEFAULT_TIKTOKEN)
    except ConfigError:
        return Estimate()


def tiktoken_counter(encoding: str) -> TokenCounter:
    """tiktoken's ``encoding``, loaded from tiktoken's cache only. Special-token strings in a text
    (``<|endoftext|>``) are counted as text.

    Raises:
        ConfigError: tiktoken is not installed, the encoding is unknown, not in the cache, or fails to load.
    """
    where = f"KSEARCH_TOKENIZER=tiktoken:{encoding}"
    try:
        import tiktoken
        import tiktoken.load as tiktoken_load
    except ImportError:
        raise ConfigError(f"{where}: tiktoken is not installed (pip install tiktoken), or use hf:<tokenizer.json> "
                          "or estimate") from None
    except Exception as e:  # a broken install
        raise ConfigError(f"{where}: tiktoken does not import: {type(e).__name__}: {e}") from None
    try:
        enc = _offline(tiktoken_load, lambda: tiktoken.get_encoding(encoding))
    except _NotCached as e:
        raise ConfigError(f"{where}: the encoding's file is not in tiktoken's cache ({e}), and ksearch does not "
                          "download it: load it once where the network is reachable (python -c \"import tiktoken; "
                          f"tiktoken.get_encoding('{encoding}')\"), or use hf:<tokenizer.json> or estimate") from None
    except Exception as e:  # an unknown encoding (ValueError), a corrupt cache, a tiktoken we do not know
        raise ConfigError(f"{where}: cannot be loaded: {type(e).__name__}: {e}") from None
    return _Encoded(f"tiktoken:{encoding}", lambda text: enc.encode(text, disallowed_special=()))


def hf_counter(path: str) -> TokenCounter:
    """A Hugging Face ``tokenizers`` tokenizer from ``path``: a tokenizer.json file or a directory holding one
    (nothing is downloaded). Counted without special tokens.

    Raises:
        ConfigError: the file is missing, the tokenizers library is not installed, or the file does not load.
    """
    where = f"KSEARCH_TOKENIZER=hf:{path}"
    p = Path(path).expanduser()
    file = p / "tokenizer.json" if p.is_dir() else p
    if not file.is_file():
        raise ConfigError(f"{where}: {file} is not a file (give a tokenizer.json, or a directory holding one)")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ConfigError(f"{where}: the tokenizers library is not installed (pip install tokenizers)") from None
    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as e:  # tokenizers raises its own Exception subclass for a file it cannot read
        raise ConfigError(f"{where}: {file} does not load as a tokenizer: {type(e).__name__}: "
                          f"{str(e)[:300]}") from None
    return _Encoded(f"hf:{path}", lambda text: tok.encode(text, add_special_tokens=False).ids)


# -- tiktoken without the network -------------------------------------------------------------------------


class _NotCached(Exception):
    """tiktoken asked for a file by URL: it is not in its cache."""


_patch_lock = threading.Lock()


def _offline(tiktoken_load, load: Callable):
    """``load()`` with tiktoken's ``load.read_file`` refusing URLs (tiktoken reads its cache first and only
    calls ``read_file`` for what is not there). Raises _NotCached for a URL, ConfigError when this tiktoken has
    no ``read_file`` to guard (it could then download)."""
    original = getattr(tiktoken_load, "read_file", None)
    if not callable(original):
        raise ConfigError("this tiktoken has no tiktoken.load.read_file, so ksearch cannot keep it from "
                          "downloading: use hf:<tokenizer.json> or estimate")

    def read_file(blobpath: str) -> bytes:
        if "://" in blobpath:
            raise _NotCached(blobpath)
        return original(blobpath)

    with _patch_lock:
        tiktoken_load.read_file = read_file
        try:
            return load()
        finally:
            tiktoken_load.read_file = original
