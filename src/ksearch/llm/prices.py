"""What a model's tokens cost: USD per million input / output tokens, and cached input where the provider
discounts it, from a built-in table (`prices.yaml`, with its sources and date) merged with an optional override
file.

A call's cost (`Price.cost`): its uncached input tokens at ``input``, the prompt tokens read from the
provider's cache (`Usage.cache_read_tokens`) at ``cached_input``, those written to it
(`Usage.cache_write_tokens`: Anthropic's cache writes) at ``cache_write``, and its output at ``output``. A
price without ``cached_input`` or ``cache_write`` charges those tokens as input (the full rate: a cost limit
errs on the safe side).

Lookup: the exact model name, then the longest table entry that is a prefix of the name followed by a version
suffix: ``-`` and a number of 3 or more digits (dates: ``gpt-4o-2024-08-06``, ``claude-sonnet-4-20250514``,
``gemini-2.0-flash-001``), ``-latest``, ``-preview``, ``-exp``, or ``@`` / ``:`` (Vertex versions, Ollama tags).
So ``gpt-4o-mini`` is priced as gpt-4o-mini, while ``claude-opus-4-6``, ``gpt-4o-audio-preview`` or ``gpt-5.1``
are not priced as claude-opus-4, gpt-4o or gpt-5: a newer model is unknown rather than wrongly priced. Then
the same after dropping a ``vendor/`` or ``models/`` prefix (OpenRouter, Gemini), with dots as dashes for
Claude names (``anthropic/claude-3.5-sonnet``). An unknown model has no price (`Prices.cost` returns None):
its tokens are still counted, its cost is not known.

An override file has the built-in shape (or is a bare mapping of model to prices)::

    models:
      my-local-model: {input: 0, output: 0}
      gpt-4o: {input: 2.0, cached_input: 0.5, output: 8.0, source: "our contract"}
      claude-sonnet-4-5: {input: 3.0, cached_input: 0.3, cache_write: 3.75, output: 15.0}

An override entry replaces the built-in one whole: cache rates it leaves out are charged as input.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from ksearch import yamlio
from ksearch.errors import ConfigError
from ksearch.llm.base import Usage

BUILTIN = Path(__file__).with_name("prices.yaml")
#: a price's optional rates (USD per million tokens): cache reads, cache writes
_CACHE_KEYS = ("cached_input", "cache_write")
#: what may follow a table entry in a model name for the entry to price it (see the module docstring)
_VERSION_SUFFIX = re.compile(r"(-(\d{3,}|latest|preview|exp)|[@:])")


@dataclass(frozen=True)
class Price:
    """USD per million tokens. ``cached_input_per_mtok``: prompt tokens read from the provider's cache;
    ``cache_write_per_mtok``: prompt tokens written to it (None: charged as input). ``source``: where the numbers
    come from (a provider key or a note)."""

    input_per_mtok: float
    output_per_mtok: float
    source: str = ""
    cached_input_per_mtok: float | None = None
    cache_write_per_mtok: float | None = None

    def cost(self, usage: Usage) -> float:
        """USD of ``usage``: uncached input, cache reads, cache writes and output, each at its rate."""
        read = self.input_per_mtok if self.cached_input_per_mtok is None else self.cached_input_per_mtok
        write = self.input_per_mtok if self.cache_write_per_mtok is None else self.cache_write_per_mtok
        return (usage.uncached_input_tokens * self.input_per_mtok + usage.cache_read_tokens * read
                + usage.cache_write_tokens * write + usage.output_tokens * self.output_per_mtok) / 1e6


def _parse(doc: object, origin: str) -> dict[str, Price]:
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"price table {origin}: expected a mapping with `models:`, got {type(doc).__name__}")
    if "models" in doc:
        models = doc["models"] or {}
    else:  # a bare mapping of model -> prices
        models = {k: v for k, v in doc.items() if k not in ("as_of", "sources")}
    if not isinstance(models, dict):
        raise ConfigError(f"price table {origin}: `models` must map model names to {{input, output}}")
    table: dict[str, Price] = {}
    for name, entry in models.items():
        if not isinstance(entry, dict) or "input" not in entry or "output" not in entry:
            raise ConfigError(f"price table {origin}: model {name!r} needs `input` and `output` "
                              f"(USD per million tokens), got {entry!r}")
        unknown = set(entry) - {"input", "output", *_CACHE_KEYS, "source"}
        if unknown:
            raise ConfigError(f"price table {origin}: model {name!r}: unknown key(s) {', '.join(sorted(unknown))} "
                              f"(a price takes input, output, {', '.join(_CACHE_KEYS)} and source)")
        rates: dict[str, float | None] = {}
        for key in ("input", "output", *_CACHE_KEYS):
            value = entry.get(key)
            if value is None and key in _CACHE_KEYS:
                rates[key] = None
                continue
            try:
                rate = float(value)
            except (TypeError, ValueError):
                raise ConfigError(f"price table {origin}: model {name!r}: prices must be numbers (USD per million "
                                  f"tokens), got {key}={value!r}") from None
            if not rate >= 0 or rate == float("inf"):
                raise ConfigError(f"price table {origin}: model {name!r}: prices must not be negative, got "
                                  f"{key}={value!r}")
            rates[key] = rate
        table[str(name)] = Price(rates["input"] or 0.0, rates["output"] or 0.0, str(entry.get("source", origin)),
                                 rates["cached_input"], rates["cache_write"])
    return table


class Prices:
    """A price table. ``as_of``: the built-in table's date note."""

    def __init__(self, table: dict[str, Price], as_of: str = ""):
        self.table = dict(table)
        self.as_of = as_of

    @classmethod
    def load(cls, override_path: str | Path | None = None) -> "Prices":
        """The built-in table, with the entries of ``override_path`` (YAML) merged over it.

        Raises:
            ConfigError: the override file is missing, not YAML, or malformed.
        """
        doc = yamlio.safe_load(BUILTIN.read_text())
        table = _parse(doc, "built-in")
        if override_path is not None:
            path = Path(override_path).expanduser()
            try:
                text = path.read_text()
            except OSError as e:
                raise ConfigError(f"price file {path}: cannot be read: {e.strerror}") from None
            try:
                override = yamlio.safe_load(text)
            except yaml.YAMLError as e:
                raise ConfigError(f"price file {path}: not valid YAML: {e}") from None
            table.update(_parse(override, str(path)))
        return cls(table, str(doc.get("as_of", "")))

    def lookup(self, model: str) -> Price | None:
        """The price of ``model`` (see the module docstring), or None when it is unknown."""
        for name in self._candidates(model):
            if name in self.table:
                return self.table[name]
            best = None
            for key in self.table:
                if len(name) > len(key) and name.startswith(key) and _VERSION_SUFFIX.match(name, len(key)):
                    if best is None or len(key) > len(best):
                        best = key
            if best is not None:
                return self.table[best]
        return None

    def cost(self, model: str, usage: Usage) -> float | None:
        """USD for ``usage`` on ``model``; None when the model has no price."""
        price = self.lookup(model)
        return None if price is None else price.cost(usage)

    @staticmethod
    def _candidates(model: str) -> list[str]:
        names = [model]
        if "/" in model:
            names.append(model.rsplit("/", 1)[1])
        names += [n.replace(".", "-") for n in names if n.startswith("claude") and "." in n]
        return names
