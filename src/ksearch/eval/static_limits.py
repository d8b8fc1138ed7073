"""Limit rules of the static checks: what a kernel declares, measured against the target's hard limits.

Two measures (a rule's ``measure``, see `static_checks.Rule`):

- ``group-memory``: the bytes of the shared (CUDA ``__shared__``) or threadgroup (Metal ``threadgroup``) arrays
  each kernel declares, per file-scope function body (arrays at file scope count for every kernel; an MLX
  ``metal_kernel`` body has no function around it and is one group). Array extents are evaluated with
  object-like ``#define``s, ``constexpr``/``const`` integers, template parameter defaults and an MLX launch's
  ``template`` values substituted (``threadgroup float tile[BM][BK + 1]`` with ``#define BM 128``); with
  ``dynamic``, a CUDA launch plan's constant ``shared_bytes`` is added to the kernel it launches. A
  declaration whose element type or extents cannot be resolved (a template ``T``, an axis) is not counted:
  the measure under-counts rather than reject an honest kernel.
- ``group-threads``: threads per block / threadgroup: a launch plan's constant ``block`` (cuda) or
  ``threadgroup`` (metal), ``__launch_bounds__(N)`` and ``[[max_total_threads_per_threadgroup(N)]]``.

Each finding names the computed value, the limit, its source, and the file and line of the declaration.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ksearch.errors import KsearchError

if TYPE_CHECKING:
    from ksearch.records import Candidate
    from ksearch.eval.static_checks import Finding, Lines, Rule

#: bytes per element of the scalar types kernels put in shared/threadgroup memory
SCALAR_BYTES: dict[str, int] = {
    "float": 4, "double": 8, "half": 2, "__half": 2, "bfloat": 2, "bfloat16_t": 2, "__nv_bfloat16": 2,
    "__nv_fp8_e4m3": 1, "__nv_fp8_e5m2": 1,
    "int": 4, "uint": 4, "unsigned": 4, "unsigned int": 4, "signed int": 4, "short": 2, "ushort": 2,
    "unsigned short": 2, "char": 1, "uchar": 1, "unsigned char": 1, "signed char": 1, "bool": 1,
    "int8_t": 1, "uint8_t": 1, "int16_t": 2, "uint16_t": 2, "int32_t": 4, "uint32_t": 4, "int64_t": 8,
    "uint64_t": 8, "long": 8, "long long": 8, "unsigned long long": 8, "unsigned long": 8, "size_t": 8,
    "atomic_int": 4, "atomic_uint": 4, "atomic_float": 4, "atomic_bool": 1,
}
#: vector type stems (CUDA float2/float4, __half2, int4, ...; Metal float4, half4, uint2, ...)
_VECTOR = re.compile(r"^(?:metal::)?(?P<base>float|double|half|__half|int|uint|short|ushort|char|uchar|long|"
                     r"ulong|longlong|ulonglong|bfloat|__nv_bfloat16|packed_float|packed_half)(?P<n>[1-4])$")
_BASE_BYTES = {"float": 4, "double": 8, "half": 2, "__half": 2, "int": 4, "uint": 4, "short": 2, "ushort": 2,
               "char": 1, "uchar": 1, "long": 8, "ulong": 8, "longlong": 8, "ulonglong": 8, "bfloat": 2,
               "__nv_bfloat16": 2, "packed_float": 4, "packed_half": 2}

_QUALIFIERS = re.compile(r"\b(static|extern|volatile|const|constexpr|__restrict__|restrict|metal::)\b|"
                         r"\b(__align__|alignas|__attribute__)\s*\((?:[^()]|\([^()]*\))*\)|\[\[[^\]]*\]\]")


def type_bytes(type_name: str, family: str, aliases: dict[str, str] | None = None) -> int | None:
    """Bytes of one element of ``type_name`` in rule family ``family``'s language (None when unknown, e.g. a
    template parameter): a three-element vector takes four elements' room where the family's rule file says
    ``vector3_padded`` (Metal; `static_checks.vector3_padded`)."""
    from ksearch.eval.static_checks import vector3_padded

    t = " ".join(type_name.replace("std::", "").split())
    for _ in range(4):  # typedef chains
        if aliases and t in aliases:
            t = aliases[t]
    if t in SCALAR_BYTES:
        return SCALAR_BYTES[t]
    m = _VECTOR.match(t)
    if m:
        base, n = _BASE_BYTES[m.group("base")], int(m.group("n"))
        if n == 3 and vector3_padded(family) and not m.group("base").startswith("packed"):
            n = 4  # Metal's float3 / half3 are padded to four elements; packed_float3 is not
        if n == 2 and m.group("base") == "__half":
            return 4
        return base * n
    m = re.match(r"^(?:metal::)?atomic\s*<\s*(\w+)\s*>$", t)
    if m:
        return SCALAR_BYTES.get(m.group(1))
    if t == "__half2" or t == "__nv_bfloat162":
        return 4
    return None


# -- constants ----------------------------------------------------------------------------------------------

_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)(?![\w(])[ \t]*(.*?)[ \t]*$", re.MULTILINE)
_CONST = re.compile(r"\b(?:constexpr|const)\s+(?:static\s+)?(?:(?:unsigned|signed|short|long)\s+)*"
                    r"(?:int|uint|unsigned|size_t|long|short|ushort|int32_t|uint32_t|int64_t|uint64_t|auto)?\s*"
                    r"([A-Za-z_]\w*)\s*(?:=\s*([^;,{}()]+(?:\([^;{}()]*\)[^;,{}()]*)*)|\{\s*([^;{}]+?)\s*\})\s*[;,]")
_TEMPLATE = re.compile(r"\btemplate\s*<([^<>]*(?:<[^<>]*>[^<>]*)*)>")
_TEMPLATE_PARAM = re.compile(r"(?:int|unsigned|uint|size_t|short|long|bool|auto)\s+([A-Za-z_]\w*)\s*=\s*([^,]+)")
_ALIAS = re.compile(r"\btypedef\s+([\w:\s<>]+?)\s+([A-Za-z_]\w*)\s*;|\busing\s+([A-Za-z_]\w*)\s*=\s*([\w:\s<>]+?)\s*;")
_SIZEOF = re.compile(r"\bsizeof\s*\(\s*([\w:\s<>]+?)\s*\)")

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.floordiv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.LShift: operator.lshift,
        ast.RShift: operator.rshift, ast.BitAnd: operator.and_, ast.BitOr: operator.or_,
        ast.BitXor: operator.xor}


def _eval_int(node: ast.AST) -> int:
    if isinstance(node, ast.Expression):
        return _eval_int(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, bool)):
        return int(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        a, b = _eval_int(node.left), _eval_int(node.right)
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and b == 0:
            raise ValueError("division by zero")
        if isinstance(node.op, ast.LShift) and b > 64:
            raise ValueError("shift too large")
        return _OPS[type(node.op)](a, b)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval_int(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    raise ValueError("not a constant integer expression")


def evaluate(expr: str, consts: dict[str, int], target: str = "cuda",
             aliases: dict[str, str] | None = None) -> int | None:
    """A C integer constant expression (names from ``consts``, ``sizeof(type)``, ``u``/``l`` suffixes, casts to
    integer types), or None when it is not one."""
    e = _SIZEOF.sub(lambda m: str(type_bytes(m.group(1), target, aliases) or "?"), expr)
    e = re.sub(r"\(\s*(?:unsigned\s+)?(?:int|uint|size_t|long|unsigned|short)\s*\)", "", e)
    e = re.sub(r"\b(0[xX][0-9a-fA-F]+|\d+)[uUlL]+\b", r"\1", e)
    e = e.replace("/", "//").replace("////", "//")
    e = re.sub(r"[A-Za-z_]\w*", lambda m: str(consts[m.group()]) if m.group() in consts else m.group(), e)
    if re.search(r"[A-Za-z_?]", re.sub(r"\b0[xX][0-9a-fA-F]+\b", "0", e)):
        return None
    try:
        return _eval_int(ast.parse(e.strip(), mode="eval"))
    except (SyntaxError, ValueError, TypeError, RecursionError, OverflowError):
        return None


def constants(code: str, target: str, extra: dict[str, int] | None = None) -> tuple[dict[str, int], dict[str, str]]:
    """Integer constants a source defines (``#define``, ``constexpr``/``const`` integers, template parameter
    defaults), each evaluated with the others substituted, and type aliases (typedef / using)."""
    raw: dict[str, str] = {}
    for m in _DEFINE.finditer(code):
        raw.setdefault(m.group(1), m.group(2))
    for m in _TEMPLATE.finditer(code):
        for p in _TEMPLATE_PARAM.finditer(m.group(1)):
            raw.setdefault(p.group(1), p.group(2).strip())
    for m in _CONST.finditer(code):
        raw.setdefault(m.group(1), (m.group(2) or m.group(3) or "").strip())
    aliases: dict[str, str] = {}
    for m in _ALIAS.finditer(code):
        if m.group(2):
            aliases[m.group(2)] = " ".join(m.group(1).split())
        else:
            aliases[m.group(3)] = " ".join(m.group(4).split())
    values: dict[str, int] = dict(extra or {})
    for _ in range(8):  # constants defined in terms of others, in any order
        changed = False
        for name, expr in raw.items():
            if name in values:
                continue
            v = evaluate(expr, values, target, aliases)
            if v is not None:
                values[name], changed = v, True
        if not changed:
            break
    return values, aliases


# -- declarations -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Declaration:
    """One shared/threadgroup array: its name, element type, extents as written, bytes, and line (1-based)."""

    name: str
    type: str
    extents: str
    bytes: int | None
    dynamic: bool
    line: int
    group: int | None  # the index of the file-scope function body it is in; None: file scope

    def describe(self) -> str:
        size = "?" if self.bytes is None else f"{self.bytes} B"
        return f"{self.type} {self.name}{self.extents} = {size} (line {self.line})"


def _function_spans(code: str) -> list[tuple[int, int, str]]:
    """(start, end, name) of each function body at file scope (extern "C" and namespace blocks are open)."""
    from ksearch.eval.static_checks import file_scope_blocks

    return [(brace, end, name) for brace, end, _, name in file_scope_blocks(code)]


def declarations(code: str, keyword: str, target: str, consts: dict[str, int],
                 aliases: dict[str, str]) -> tuple[list[Declaration], list[tuple[int, int, str]]]:
    """The arrays declared with ``keyword`` in ``code`` (comments removed), and the function spans."""
    spans = _function_spans(code)
    out: list[Declaration] = []
    for m in re.finditer(rf"(?<![\w.:]){re.escape(keyword)}(?!\w)([^;{{}}()]*(?:\([^;{{}}()]*\)[^;{{}}()]*)*);", code):
        body = m.group(1)
        if "(" in _QUALIFIERS.sub(" ", body):  # a function or a call, not a declaration
            continue
        before = code[max(0, m.start() - 80):m.start()]
        is_extern = bool(re.search(r"\bextern\b[^;{}]*$", before))
        line = code.count("\n", 0, m.start()) + 1
        group = next((i for i, (a, b, _) in enumerate(spans) if a <= m.start() < b), None)
        parts = _split_top(_QUALIFIERS.sub(" ", body))
        first = re.match(r"\s*(?P<type>.+?)\s*(?P<rest>\*?\s*[A-Za-z_]\w*\s*(?:\[[^\]]*\]\s*)*(?:=.*)?)$",
                         parts[0], re.DOTALL) if parts else None
        if not first:
            continue
        ctype = " ".join(first.group("type").split())
        for i, part in enumerate(parts):
            decl = first.group("rest") if i == 0 else part
            d = re.match(r"\s*(?P<ptr>\*)?\s*(?P<name>[A-Za-z_]\w*)\s*(?P<dims>(?:\[[^\]]*\]\s*)*)(?:=.*)?$",
                         decl, re.DOTALL)
            if not d or d.group("ptr") or ctype.endswith("*") or ctype.endswith("&"):
                continue  # a pointer into the space, not storage
            dims = re.findall(r"\[([^\]]*)\]", d.group("dims"))
            dynamic = is_extern or any(not x.strip() for x in dims)
            size = type_bytes(ctype, target, aliases)
            total: int | None = 0 if dynamic else size
            if not dynamic and size is not None:
                for x in dims:
                    v = evaluate(x, consts, target, aliases)
                    if v is None or v < 0 or total is None:
                        total = None
                        break
                    total *= v
            out.append(Declaration(d.group("name"), ctype, "".join(f"[{x.strip()}]" for x in dims), total,
                                   dynamic, line, group))
    return out, spans


def _split_top(s: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in s:
        if ch in "[(<{":
            depth += 1
        elif ch in "])>}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in parts if p.strip()]


# -- limits of a device ------------------------------------------------------------------------------------

def device_limit_rules(family: str | None, hardware=None) -> list["Rule"]:
    """The limit rules (those with a ``measure``) of rule family ``family`` (the family whose limits a target's
    kernels hit: `ksearch.targets.base.Target.limit_family`; triton's is cuda) on ``hardware``.

    Each rule's limit comes from the hardware catalog: the entry ``hardware`` is (found by its ``name``, then its
    ``model``; `ksearch.hardware.catalog.find`) when the catalog has it, else the rule file's reference entry
    (``limits`` table of ``eval/static_rules/<file>.yaml``, `static_checks.Limit.resolved`). ``hardware``: a
    HardwareSpec, a catalog name, or None (the reference device). [] for a family without limit rules (cpu), or
    None.
    """
    from ksearch.eval.static_checks import limits_for, rules_for
    from ksearch.hardware import catalog

    rules = [r for r in rules_for(family) if r.measure]
    if not rules or hardware is None:
        return rules
    names = [hardware] if isinstance(hardware, str) else [getattr(hardware, "name", ""), getattr(hardware, "model", "")]
    entry = next((e for e in (catalog.find(n) for n in names if n) if e is not None), None)
    if entry is None:
        return rules
    table = limits_for(family)
    out = []
    for rule in rules:
        lim = table.get(rule.limit or "")
        try:
            value = getattr(catalog.limits(entry.name), lim.figure) if lim is not None and lim.figure else None
        except (KsearchError, AttributeError):
            value = None
        if value is None or lim is None or not lim.figure:
            out.append(rule)
            continue
        source = f"hardware catalog {entry.name} ({lim.figure}): {entry.source_of(lim.figure) or ''}"
        out.append(rule.model_copy(update={"limit_value": int(value), "limit_source": source}))
    return out


# -- the measures -------------------------------------------------------------------------------------------




def _launch_consts(candidate: "Candidate") -> dict[str, int]:
    """MLX-style ``template`` values of a launch ([[name, value], ...] or {name: value}), as constants."""
    t = candidate.launch.get("template") if isinstance(candidate.launch, dict) else None
    items = t.items() if isinstance(t, dict) else (t or [])
    out = {}
    for item in items:
        try:
            name, value = item
        except (TypeError, ValueError):
            continue
        if isinstance(value, (int, bool)) and isinstance(name, str):
            out[name] = int(value)
    return out


def _mlx_shared(candidate: "Candidate") -> list[dict]:
    """An MLX launch's dynamic ``shared_memory`` (mlx-cuda's; a cuda plan has none at its top level), in the shape
    of a cuda launch (kernel None: the body)."""
    if not isinstance(candidate.launch, dict) or "shared_memory" not in candidate.launch:
        return []
    return [{"kernel": None, "shared_bytes": candidate.launch.get("shared_memory", 0)}]


def _launches(candidate: "Candidate") -> list[dict]:
    launches = candidate.launch.get("launches") if isinstance(candidate.launch, dict) else None
    return [x for x in launches if isinstance(x, dict)] if isinstance(launches, list) else []


def measure(rule: "Rule", candidate: "Candidate", code_view: dict[str, "Lines"]) -> list["Finding"]:
    if rule.measure == "group-memory":
        return _group_memory(rule, candidate, code_view)
    if rule.measure == "group-threads":
        return _group_threads(rule, candidate, code_view)
    return []


def _finding(rule: "Rule", candidate: "Candidate", file: str, line: int, what: str) -> "Finding":
    from ksearch.eval.static_checks import Finding, _original_line

    limit = f"{rule.limit_value}{' B' if 'bytes' in (rule.limit or '') else ''}"
    why = f"{what}, over the limit of {limit} ({rule.limit}; {rule.limit_source}): {rule.why}"
    return Finding(rule.id, file, line, _original_line(candidate.sources.get(file, ""), line) or what, why)


def _joined(lines: "Lines") -> tuple[str, list[int]]:
    return "\n".join(t for _, t in lines), [ln for ln, _ in lines]


def _group_memory(rule: "Rule", candidate: "Candidate", code_view: dict[str, "Lines"]) -> list["Finding"]:
    family, limit = rule.dialect, rule.limit_value or 0
    findings = []
    for name, lines in code_view.items():
        if name.endswith(".py"):
            continue
        code, numbers = _joined(lines)
        consts, aliases = constants(code, family, _launch_consts(candidate))
        decls, spans = declarations(code, rule.keyword or "", family, consts, aliases)
        if not decls:
            continue
        decls = [d for d in decls if 0 < d.line <= len(numbers)]
        decls = [Declaration(d.name, d.type, d.extents, d.bytes, d.dynamic, numbers[d.line - 1], d.group)
                 for d in decls]
        file_scope = [d for d in decls if d.group is None]
        groups: list[int | None] = [*sorted({d.group for d in decls if d.group is not None})] or [None]
        worst = None
        for g in groups:
            members = file_scope + ([d for d in decls if d.group == g] if g is not None else [])
            static = sum(d.bytes or 0 for d in members)
            dyn, fn = 0, spans[g][2] if g is not None and g < len(spans) else ""
            if rule.dynamic:
                for launch in _launches(candidate) + _mlx_shared(candidate):
                    if fn and launch.get("kernel") not in (fn, None):
                        continue
                    v = evaluate(str(launch.get("shared_bytes", 0)), consts, family, aliases)
                    dyn = max(dyn, v or 0)
            total = static + dyn
            if total > limit and (worst is None or total > worst[0]):
                worst = (total, static, dyn, members, fn)
        if worst is None:
            continue
        total, static, dyn, members, fn = worst
        counted = [d for d in members if d.bytes]
        biggest = max(counted, key=lambda d: d.bytes or 0) if counted else members[0]
        parts = "; ".join(d.describe() for d in counted)
        what = (f"{rule.keyword} memory of {('kernel ' + fn) if fn else 'the kernel'}: {total} B "
                f"({parts}{f'; + {dyn} B dynamic from the launch plan' if dyn else ''})")
        findings.append(_finding(rule, candidate, name, biggest.line, what))
    return findings


_BOUNDS = re.compile(r"\b(?:__launch_bounds__|max_total_threads_per_threadgroup)\s*\(\s*([^,()]+(?:\([^()]*\)[^,()]*)*)")


def _group_threads(rule: "Rule", candidate: "Candidate", code_view: dict[str, "Lines"]) -> list["Finding"]:
    family, limit = rule.dialect, rule.limit_value or 0
    findings = []
    all_consts: dict[str, int] = _launch_consts(candidate)
    for name, lines in code_view.items():
        if name.endswith(".py"):
            continue
        code, numbers = _joined(lines)
        consts, aliases = constants(code, family, _launch_consts(candidate))
        all_consts.update(consts)
        for m in _BOUNDS.finditer(code):
            v = evaluate(m.group(1), consts, family, aliases)
            if v is not None and v > limit:
                idx = code.count("\n", 0, m.start())
                findings.append(_finding(rule, candidate, name, numbers[idx] if idx < len(numbers) else idx + 1,
                                         f"{m.group(0).strip()}) declares {v} threads per group"))
                break
    sizes: list[tuple[str, Any]] = [(f"launches.{i}.block", x.get("block")) for i, x in enumerate(_launches(candidate))]
    if isinstance(candidate.launch, dict) and candidate.launch.get("threadgroup") is not None:
        sizes.append(("threadgroup", candidate.launch.get("threadgroup")))
    for where, dims in sizes:
        if not isinstance(dims, (list, tuple)) or not dims:
            continue
        values = [evaluate(str(x), all_consts, family) for x in dims]
        known = [v for v in values if v is not None]
        if len(known) < len(values):
            continue  # depends on the workload's axes: the launch itself checks it
        n = math.prod(known)
        if n > limit:
            findings.append(_finding(rule, candidate, "launch plan", 0,
                                     f"{where} {list(dims)} is {n} threads per group"))
    return findings
