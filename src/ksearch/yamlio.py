"""YAML as ksearch reads it: the safe subset (plain data: mappings, sequences, scalars), parsed by libyaml's C
parser where PyYAML was built with it (``yaml.CSafeLoader``: the built-in task definitions and knowledge packs
load ~12x faster than through the pure-Python ``SafeLoader``, with identical results), else by ``SafeLoader``."""

from __future__ import annotations

from typing import Any

import yaml

#: the loader every YAML read in ksearch goes through
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_load(text: str) -> Any:
    """The document in ``text`` (str) as Python data; None for an empty one. Raises yaml.YAMLError on a malformed
    document, as ``yaml.safe_load`` does (callers turn it into their own one-line errors)."""
    return yaml.load(text, Loader=SAFE_LOADER)
