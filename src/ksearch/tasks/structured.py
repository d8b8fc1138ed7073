"""Inputs whose values are structure, not data: paged/ragged index arrays, and constraints over drawn inputs.

Attention over a paged or ragged KV cache (flashinfer-bench's ``gqa_paged``, ``mla_paged``, ``gqa_ragged``) takes
integer arrays that describe where each sequence lies; random integers break the reference's own assumptions
(an ``indptr`` that is not monotone, a page id past the cache). Inputs are recognised by name, as flashinfer
spells them:

- ``<p>_indptr`` (1-D, integer): starts at 0, never decreases; its last value is the length of ``<p>_indices``
  when the definition has that input, else the axis a constraint ``AXIS == <p>_indptr[-1].item()`` names, else
  (len - 1) times a number drawn in [1, 8]. Segments are at least 1 long where the total allows (a sequence of
  no pages has no last page).
- ``<p>_indices`` (1-D, integer): page (or token) ids in [0, num_pages) (the ``num_pages`` axis), distinct where
  there are enough pages;
- ``<p>_last_page_len`` (1-D, integer): in [1, page_size] (the ``page_size`` axis);
- ``qo_indptr`` beside a ``kv_indptr`` (prefill): no sequence gets more queries than it has keys (pages times
  page_size, the last page counted by ``kv_last_page_len``), where the totals allow, as a causal mask aligned to
  the end of the keys needs.

Constraints that read input data (``num_kv_indices == kv_indptr[-1].item()``, ``total_q == qo_indptr[-1]``) are
*data constraints*: checked on the inputs once drawn (`check_data_constraints`), with NumPy arrays in place of
tensors; ``.item()``, ``.shape``, ``len()`` and indexing are allowed, nothing else (no imports, no other attributes).
"""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING, Any

import numpy as np

from ksearch.errors import TaskError

if TYPE_CHECKING:
    from ksearch.tasks.definition import Definition

_DATA_NODES = (
    ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.Name, ast.Load, ast.Constant,
    ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.USub, ast.UAdd,
    ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.And, ast.Or, ast.Not, ast.IfExp,
    ast.Call, ast.Attribute, ast.Subscript, ast.Slice, ast.Tuple,
)
#: attributes a data constraint may read or call (NumPy arrays have them as torch tensors do; ``numel`` and ``dim``,
#: torch's, are given to them: `_TensorLike`)
_DATA_ATTRS = {"item", "shape", "size", "ndim", "sum", "min", "max", "all", "any", "numel", "dim"}


class _TensorLike(np.ndarray):
    """A NumPy array answering torch's ``numel()`` and ``dim()`` too, for data constraints written against tensors."""

    def numel(self) -> int:
        return int(self.size)

    def dim(self) -> int:
        return int(self.ndim)
_DATA_CALLS = {"len": len, "min": min, "max": max, "abs": abs, "int": int, "bool": bool}


def is_data_constraint(expr: str, inputs) -> bool:
    """Whether a constraint reads input data: it names an input, or uses indexing or attributes (``x[-1]``,
    ``.item()``). ``inputs``: the definition's input names (any container)."""
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        return False  # the axis check reports it
    return any(isinstance(n, (ast.Attribute, ast.Subscript)) or (isinstance(n, ast.Name) and n.id in inputs)
               for n in ast.walk(tree))


def compile_data_constraint(expr: str, known=None):
    """Compile a data constraint after checking its nodes and, given ``known`` (the definition's axis and input
    names), that every name it reads is one of them or an allowed function. Raises ValueError naming what is not
    allowed (an unknown name is caught when the definition loads, not at its first check)."""
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as e:
        raise ValueError(f"constraint {expr!r} is not valid Python: {e.msg}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _DATA_NODES):
            raise ValueError(f"constraint {expr!r} uses {type(node).__name__}, which is not allowed")
        if isinstance(node, ast.Attribute) and node.attr not in _DATA_ATTRS:
            raise ValueError(f"constraint {expr!r} reads .{node.attr}; allowed: {sorted(_DATA_ATTRS)}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id not in _DATA_CALLS:
            raise ValueError(f"constraint {expr!r} calls {node.func.id}; allowed: {sorted(_DATA_CALLS)}")
        if known is not None and isinstance(node, ast.Name) and node.id not in known and node.id not in _DATA_CALLS:
            raise ValueError(f"constraint {expr!r} reads {node.id!r}, which is neither an axis nor an input "
                             f"({sorted(known)})")
    return compile(tree, "<constraint>", "eval")


def check_data_constraints(definition: "Definition", label: str, axes: dict[str, int], inputs: dict) -> None:
    """Evaluate the definition's data constraints on drawn (or loaded) inputs.

    Raises:
        TaskError: a constraint is false (the message shows it, with the axis values), or fails to evaluate.
    """
    for expr in definition.data_constraints:
        arrays = {k: (v.view(_TensorLike) if isinstance(v, np.ndarray) else v) for k, v in inputs.items()
                  if v is not None}
        names: dict[str, Any] = {**_DATA_CALLS, **axes, **arrays}
        try:
            ok = eval(compile_data_constraint(expr), {"__builtins__": {}}, names)  # noqa: S307 - AST-checked
        except Exception as e:  # an index past an array, a name that is neither axis nor input
            raise TaskError(f"workload {label!r}: constraint {expr!r} of {definition.name!r} cannot be evaluated "
                            f"on its inputs: {type(e).__name__}: {e}") from None
        if not bool(ok):
            raise TaskError(f"workload {label!r} breaks constraint {expr!r} of {definition.name!r} on its inputs "
                            f"(axes {axes})")


# -- index arrays ----------------------------------------------------------------------------------

_ROLE = re.compile(r"(?P<prefix>.*?)_?(?P<role>indptr|indices|last_page_len)$")


def index_inputs(definition: "Definition") -> dict[str, tuple[str, str]]:
    """The inputs drawn as index structure: name -> (role, prefix), role one of ``indptr``, ``indices``,
    ``last_page_len``; only 1-D integer inputs."""
    out = {}
    for name, spec in definition.inputs.items():
        m = _ROLE.fullmatch(name)
        if m and spec.shape is not None and len(spec.shape) == 1 and spec.dtype in ("int32", "int64", "uint8",
                                                                                    "int16", "int8"):
            out[name] = (m.group("role"), m.group("prefix"))
    return out


def _total_from_constraints(definition: "Definition", name: str, axes: dict[str, int]) -> int | None:
    """The axis value a constraint ``AXIS == name[-1]...`` (either side) ties the last entry of ``name`` to."""
    for expr in definition.data_constraints:
        tree = ast.parse(expr, mode="eval").body
        if not (isinstance(tree, ast.Compare) and len(tree.ops) == 1 and isinstance(tree.ops[0], ast.Eq)):
            continue
        sides = [tree.left, tree.comparators[0]]
        for a, b in (sides, sides[::-1]):
            if isinstance(a, ast.Name) and a.id in axes and name in {n.id for n in ast.walk(b)
                                                                     if isinstance(n, ast.Name)}:
                return axes[a.id]
    return None


def _split(rng: np.random.Generator, total: int, parts: int) -> np.ndarray:
    """``parts`` non-negative segment lengths summing to ``total``, each at least 1 where ``total >= parts``."""
    if parts <= 0:
        return np.zeros(0, np.int64)
    base = 1 if total >= parts else 0
    rest = total - base * parts
    cuts = np.sort(rng.integers(0, rest + 1, parts - 1))
    return np.diff(np.concatenate([[0], cuts, [rest]])) + base


def fill_index_inputs(definition: "Definition", axes: dict[str, int], seed: int, label: str,
                      out: dict[str, Any]) -> None:
    """Draw the index inputs (`index_inputs`) that the workload leaves random, in place in ``out`` (name ->
    array of the input's storage dtype), consistent with each other and with the axes (module docstring).

    Raises:
        TaskError: a total the arrays cannot hold (an indptr whose indices are longer than an int8 allows).
    """
    roles = index_inputs(definition)
    rng = np.random.default_rng([seed, 0x1D7])
    by_prefix: dict[str, dict[str, str]] = {}
    for name, (role, prefix) in roles.items():
        by_prefix.setdefault(prefix, {})[role] = name
    page_size = axes.get("page_size")
    num_pages = axes.get("num_pages")
    for prefix, names in sorted(by_prefix.items(), key=lambda kv: kv[0] == "qo"):  # queries after the KV
        if "indptr" in names and names["indptr"] in out and out[names["indptr"]] is None:
            spec = definition.inputs[names["indptr"]]
            length = axes[_axis(spec)]
            idx_name = names.get("indices")
            total = axes[_axis(definition.inputs[idx_name])] if idx_name else \
                _total_from_constraints(definition, names["indptr"], axes)
            if total is None:
                total = int(rng.integers(1, 9)) * max(length - 1, 0)
            caps = _kv_tokens(by_prefix.get("kv", {}), out, page_size) if prefix == "qo" else None
            if caps is not None and len(caps) == length - 1 and length - 1 <= total <= caps.sum():
                segments = _split_capped(rng, total, caps)  # no sequence with more queries than keys (causal)
            else:
                segments = _split(rng, total, length - 1)
            indptr = np.concatenate([[0], np.cumsum(segments)]) if length else np.zeros(0)
            out[names["indptr"]] = _as(indptr, spec.dtype, names["indptr"], label)
        if "indices" in names and names["indices"] in out and out[names["indices"]] is None:
            spec = definition.inputs[names["indices"]]
            n = axes[_axis(spec)]
            bound = num_pages if num_pages else max(n, 1)
            ids = rng.permutation(bound)[:n] if n <= bound else rng.integers(0, bound, n)
            out[names["indices"]] = _as(ids, spec.dtype, names["indices"], label)
        if "last_page_len" in names and names["last_page_len"] in out and out[names["last_page_len"]] is None:
            spec = definition.inputs[names["last_page_len"]]
            n = axes[_axis(spec)]
            out[names["last_page_len"]] = _as(rng.integers(1, (page_size or 1) + 1, n), spec.dtype,
                                              names["last_page_len"], label)


def _kv_tokens(kv: dict[str, str], out: dict[str, Any], page_size: int | None) -> np.ndarray | None:
    """Keys per sequence from the KV index arrays already in ``out``: ``kv_indptr``'s segments, counted in pages
    where there are ``kv_indices`` ((pages - 1) * page_size + last_page_len, or pages * page_size), else tokens."""
    indptr = out.get(kv.get("indptr", ""))
    if indptr is None:
        return None
    seg = np.diff(np.asarray(indptr, np.int64))
    if "indices" not in kv:
        return seg
    last = out.get(kv.get("last_page_len", ""))
    size = page_size or 1
    if last is not None and len(last) == len(seg):
        return np.where(seg > 0, (seg - 1) * size + np.asarray(last, np.int64), 0)
    return seg * size


def _split_capped(rng: np.random.Generator, total: int, caps: np.ndarray) -> np.ndarray:
    """Segment lengths in [1, caps[i]] summing to ``total`` (1 <= total - len(caps) + len(caps) <= caps.sum())."""
    seg = np.minimum(np.ones(len(caps), np.int64), caps)
    left = total - int(seg.sum())
    while left > 0:
        room = caps - seg
        add = np.minimum(rng.multinomial(left, room / room.sum()), room)
        seg += add
        left -= int(add.sum())
    return seg


def _axis(spec) -> str:
    """The one axis of a 1-D input (`index_inputs` picks only those)."""
    assert spec.shape is not None and len(spec.shape) == 1
    return spec.shape[0]


def _as(values: np.ndarray, dtype: str, name: str, label: str) -> np.ndarray:
    target = np.dtype(dtype)
    if values.size and values.max() > np.iinfo(target).max:
        raise TaskError(f"workload {label!r}: index input {name!r} needs values up to {int(values.max())}, more "
                        f"than {dtype} holds")
    return np.ascontiguousarray(values, target)
