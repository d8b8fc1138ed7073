"""Definitions as FlashInfer's own trace dumper writes them (``@flashinfer_api(trace=...)``, one JSON per op and
shape under ``FLASHINFER_TRACE_DUMP_DIR``; flashinfer-ai/flashinfer PR 2931, its examples in
``tests/trace/fi_trace_out/``). They are flashinfer-bench definitions with four differences, each read here with
its meaning or refused in one line:

- ``reference`` defines ``_<op>_reference(...)``, not ``run``: a ``run`` that calls it is added;
- ``"dtype": "unknown"``: a tensor the dumper did not see (it reads ``run()``'s arguments; index arrays are set at
  ``plan()`` time). An index array (``*_indptr``, ``*_indices``, ``*_last_page_len``, 1-D) is ``int32``, the dtype
  FlashInfer's ``plan()`` takes them in (its own input helpers make them so); any other such tensor is refused,
  naming it: its dtype is not in the file;
- ``"optional": true`` on an input: the API may be called without it. ksearch always gives every input (drawn like
  the others), a case the kernel must handle anyway; the flag is kept, not acted on;
- ``init``: Python that builds the arguments of FlashInfer's own API (``{"plan": ..., "run": ...}`` on ``cuda``),
  not the definition's inputs by name. It is kept with the definition and never run: inputs are drawn from the
  shapes, index arrays consistent (`ksearch.tasks.structured`).

A name in both ``inputs`` and ``outputs`` (the dumper's in-place ops) stays refused by `Definition`: a kernel's
inputs are read-only here.
"""

from __future__ import annotations

import ast
import re

#: the dtype FlashInfer's plan() index arrays have (flashinfer/trace's input helpers build them as torch.int32)
INDEX_DTYPE = "int32"
_INDEX_NAME = re.compile(r".*(indptr|indices|last_page_len)$")


def _top_functions(source: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []  # the definition's own check says what is wrong
    return [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def read_trace_dump(data: dict) -> dict:
    """The raw definition mapping with the dumper's differences read as the module docstring says (a copy; a
    definition without them comes back equal). Raises ValueError for an ``unknown`` dtype it cannot resolve."""
    out = dict(data)
    ref = out.get("reference")
    if isinstance(ref, str) and "def run" not in ref:
        refs = [f for f in _top_functions(ref) if f.endswith("_reference")]
        if len(refs) == 1:
            out["reference"] = (ref.rstrip() + f"\n\n\n# added by ksearch: FlashInfer's trace dumper names the "
                                f"reference {refs[0]}\ndef run(*args, **kwargs):\n    return {refs[0]}(*args, "
                                "**kwargs)\n")
    for kind in ("inputs", "outputs"):
        specs = out.get(kind)
        if not isinstance(specs, dict):
            continue
        fixed = {}
        for name, spec in specs.items():
            if isinstance(spec, dict) and spec.get("dtype") == "unknown":
                shape = spec.get("shape")
                if kind != "inputs" or not _INDEX_NAME.fullmatch(str(name)) or not isinstance(shape, list) \
                        or len(shape) != 1:
                    raise ValueError(f"{kind[:-1]} {name!r} has dtype \"unknown\" (FlashInfer's trace dumper writes "
                                     "it for a tensor it did not see, one set at plan() time): give its dtype")
                spec = {**spec, "dtype": INDEX_DTYPE}
            fixed[name] = spec
        out[kind] = fixed
    return out
