"""Static checks of a candidate's sources before compiling: rules per target, kept as data.

The rules of a target live in ``static_rules/<target>.yaml`` beside this module (see cpu.yaml for the format;
``include: <other>`` puts another file's rules and limits first, as mlx-metal.yaml does with metal.yaml).
Each rule is a regular expression matched against one *view* of the candidate:

- ``text``: each source as written, comments removed, string literals kept;
- ``code``: the candidate's own lines as the compiler sees them (after the preprocessor, when the target can
  run it: macros cannot hide a call), string literal contents blanked;
- ``definitions``: the names of the functions the candidate defines at file scope, one per line;
- ``includes``: files the preprocessor pulled in that are neither the candidate's own nor system headers.

Python sources (``*.py``, the triton target) get the same views from Python's tokenizer (`strip_py`): ``#``
comments removed, string contents blanked in ``code`` (an f-string's expressions stay visible), backslash
line continuations joined; ``definitions`` are the module's top-level ``def`` names.

A match is a `Finding` (rule, file, line, the line's text, the reason); the evaluator rejects the candidate
with the first one. The checks are a first line, not the only one: the sandbox contains what they miss.

A rule may carry ``unless`` (a regular expression: the rule is skipped for a file whose view matches it, e.g.
``uint`` is Metal-only unless the file typedefs it). A *limit* rule has a ``measure`` instead of a pattern
(`static_limits`): ``group-memory`` sums the shared/threadgroup arrays a kernel declares (``#define``,
``constexpr``/``const`` and template defaults substituted) against ``limit``, a key of the rule file's
``limits`` table (value + source); ``group-threads`` checks a launch plan's block / threadgroup size and
``__launch_bounds__`` / ``[[max_total_threads_per_threadgroup(N)]]``. Their findings name the computed value,
the limit and its source, and the declaration's line.
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Literal

import yaml
from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from ksearch.errors import KsearchError, TargetError
from ksearch.eval.records import Candidate

RULES_DIR = Path(__file__).parent / "static_rules"

View = Literal["text", "code", "definitions", "includes"]
Measure = Literal["group-memory", "group-threads"]


class Limit(BaseModel):
    """One hard limit of a target (``limits`` in a rule file): a value and where the number comes from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    value: int
    unit: str = ""
    source: str
    #: a hardware catalog entry and one of its `Limits` fields: when both are given and the catalog has the
    #: entry, the value and its source come from there (``value``/``source`` are the fallback)
    catalog: str | None = None
    figure: str | None = None

    def resolved(self) -> "Limit":
        """This limit with the value and source of the hardware catalog's entry where it has one."""
        if not (self.catalog and self.figure):
            return self
        try:
            from ksearch.hardware import catalog
        except ImportError:  # pragma: no cover - the catalog ships with the package
            return self
        try:
            value = getattr(catalog.limits(self.catalog), self.figure)
            where = catalog.get(self.catalog).source_of(self.figure) or ""
        except (KsearchError, AttributeError):
            return self
        return self.model_copy(update={"value": int(value),
                                       "source": f"hardware catalog {self.catalog} ({self.figure}): {where}"})


class Rule(BaseModel):
    """One static check: ``pattern`` (a Python regular expression) searched in view ``in``."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    id: str
    why: str
    pattern: str = ""
    view: View = "code"
    #: a regular expression: the rule does not apply to a file whose view matches it (e.g. a typedef)
    unless: str | None = None
    #: a limit rule: what is measured (see `static_limits`) and the key of the limit in the file's table
    measure: Measure | None = None
    limit: str | None = None
    #: group-memory: the address-space keyword of the declarations (``__shared__``, ``threadgroup``)
    keyword: str | None = None
    #: group-memory: add the launch plan's dynamic shared bytes (``launches[].shared_bytes``)
    dynamic: bool = False
    #: the resolved limit (filled in from the rule file's ``limits`` table when the rules load)
    limit_value: int | None = None
    limit_source: str = ""

    def __init__(self, **data):
        if "in" in data:
            data["view"] = data.pop("in")
        super().__init__(**data)

    @field_validator("pattern", "unless")
    @classmethod
    def _compiles(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            re.compile(v)
        except re.error as e:
            raise ValueError(f"pattern {v!r} is not a valid regular expression: {e}") from None
        return v

    @model_validator(mode="after")
    def _pattern_or_measure(self) -> "Rule":
        if bool(self.pattern) == bool(self.measure):
            raise ValueError(f"rule {self.id!r}: give either a pattern or a measure")
        if self.measure and not self.limit:
            raise ValueError(f"rule {self.id!r}: a measure needs a limit (a key of the file's limits table)")
        if self.measure == "group-memory" and not self.keyword:
            raise ValueError(f"rule {self.id!r}: group-memory needs the declarations' keyword")
        return self

    @property
    def regex(self) -> re.Pattern:
        return _compiled(self.pattern)


@lru_cache(maxsize=256)
def _compiled(pattern: str) -> re.Pattern:
    return re.compile(pattern, re.MULTILINE)


@dataclass(frozen=True)
class Finding:
    """A rule matched: where (``file``, 1-based ``line``), what (``text``, the line) and why."""

    rule: str
    file: str
    line: int
    text: str
    why: str

    def __str__(self) -> str:
        return f"static check {self.rule!r}: {self.file}:{self.line}: {self.text.strip()[:160]} ({self.why})"


@lru_cache(maxsize=8)
def _rule_file(target: str) -> tuple[tuple[Rule, ...], dict[str, Limit]]:
    path = RULES_DIR / f"{target}.yaml"
    if not path.is_file():
        return (), {}
    try:
        data = yaml.safe_load(path.read_text()) or {}
        # ``include: other``: the rules and limits of other.yaml first, then this file's (mlx-metal: metal's)
        base_rules, base_limits = _rule_file(data["include"]) if data.get("include") else ((), {})
        # values from the hardware catalog's limits() of the entry each limit names (the target's reference
        # device: the judge does not pass the run's device to the rules yet), the table's as the fallback
        limits = {**base_limits, **{k: Limit(**v).resolved() for k, v in (data.get("limits") or {}).items()}}
        rules = list(base_rules)
        for r in data.get("rules", []):
            rule = Rule(**r)
            if rule.limit is not None:
                if rule.limit not in limits:
                    raise ValueError(f"rule {rule.id!r} names limit {rule.limit!r}, not in the limits table "
                                     f"({', '.join(limits) or 'empty'})")
                lim = limits[rule.limit]
                rule = rule.model_copy(update={"limit_value": lim.value, "limit_source": lim.source})
            rules.append(rule)
        return tuple(rules), limits
    except (yaml.YAMLError, ValueError, TypeError) as e:
        raise TargetError(f"static rules {path} are malformed: {e}") from None


def rules_for(target: str) -> tuple[Rule, ...]:
    """The rules of a target (empty when it has no rule file). Raises TargetError on a malformed file."""
    return _rule_file(target)[0]


def limits_for(target: str) -> dict[str, Limit]:
    """The hard limits a target's rule file declares (``limits``: name -> value and source)."""
    return dict(_rule_file(target)[1])


# -- views ------------------------------------------------------------------------------------------------

#: One file of a view: (1-based line number in the candidate's file, text) per line.
Lines = list[tuple[int, str]]


def strip_c(source: str, keep_strings: bool) -> str:
    """Remove C/C++ comments (keeping line breaks); blank the contents of string and character literals
    unless ``keep_strings``."""
    out: list[str] = []
    i, n = 0, len(source)
    while i < n:
        c = source[i]
        nxt = source[i + 1] if i + 1 < n else ""
        if c == "/" and nxt == "/":
            j = source.find("\n", i)
            i = n if j < 0 else j
        elif c == "/" and nxt == "*":
            j = source.find("*/", i + 2)
            chunk = source[i:n if j < 0 else j + 2]
            out.append("\n" * chunk.count("\n") + " ")
            i = n if j < 0 else j + 2
        elif c in "\"'":
            j = i + 1
            while j < n and source[j] != c and source[j] != "\n":
                j += 2 if source[j] == "\\" else 1
            lit = source[i:j + 1]
            out.append(lit if keep_strings else c + " " * max(0, len(lit) - 2) + (c if j < n else ""))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def strip_py(source: str, keep_strings: bool) -> str:
    """Python ``source`` with ``#`` comments blanked and, unless ``keep_strings``, the contents of string
    literals blanked (quotes and prefixes kept; an f-string's expressions kept: before Python 3.12 an f-string
    is one token, kept whole). A backslash that continues a line becomes a space, so ``torch.\\<newline>x``
    reads as ``torch. x``. Line and column positions are unchanged. Source the tokenizer refuses is returned
    as it is (the compile step reports it)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return source
    starts = [0]
    for line in source.split("\n"):
        starts.append(starts[-1] + len(line) + 1)
    chars = list(source)

    def blank(start: tuple[int, int], end: tuple[int, int]) -> None:
        for i in range(starts[start[0] - 1] + start[1], min(starts[end[0] - 1] + end[1], len(chars))):
            if chars[i] != "\n":
                chars[i] = " "

    middle = getattr(tokenize, "FSTRING_MIDDLE", None)
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            blank(tok.start, tok.end)
        elif keep_strings:
            continue
        elif tok.type == tokenize.STRING:
            m = re.match(r"([A-Za-z]*)('''|\"\"\"|'|\")", tok.string)
            if m is None or "f" in m.group(1).lower():
                continue
            head, quote = len(m.group(0)), len(m.group(2))
            if len(tok.string) < head + quote:
                continue
            s_row, s_col = tok.start
            e_row, e_col = tok.end
            blank((s_row, s_col + head), (e_row, e_col - quote))
        elif middle is not None and tok.type == middle:
            blank(tok.start, tok.end)
    return re.sub(r"\\(?=\r?\n)", " ", "".join(chars))


def _is_python(name: str) -> bool:
    return name.endswith(".py")


def _numbered(text: str) -> Lines:
    return [(i + 1, line) for i, line in enumerate(text.split("\n"))]


_HEAD_RE = re.compile(r"(~?[A-Za-z_]\w*)\s*\((?:[^()]|\([^()]*\))*\)\s*(?:const\b|noexcept\b|__attribute__\s*\(\(.*?\)\)\s*)*$",
                      re.DOTALL)
_OPEN_NO_DEPTH = re.compile(r"(\bextern\s*\"\s*\"|\bnamespace\b[^;{}]*)\s*$")


def file_scope_blocks(code: str) -> list[tuple[int, int, str, str]]:
    """(opening brace offset, closing brace end offset, head, function name or "") of each brace block at file
    scope in C/C++ ``code`` (comments removed, strings blanked). ``extern "C" { ... }`` and namespace blocks are
    walked into: what they hold counts as file scope. ``head`` is the text between the previous ``;``/``}``/``{``
    at that level and the block; the name is "" when the head is not a function signature. A block never closed
    (unbalanced source) runs to the end of the code."""
    blocks, depth, start, transparent, opened = [], 0, 0, [], None
    for m in re.finditer(r"[{};]", code):
        ch = m.group()
        if ch == "{":
            head = code[start:m.start()]
            if depth == 0 or (transparent and transparent[-1] == depth):
                if _OPEN_NO_DEPTH.search(head):
                    transparent.append(depth)
                    start = m.end()
                    continue
                fn = _HEAD_RE.search(head.rstrip())
                opened = (len(blocks), depth)
                blocks.append((m.start(), len(code), head, fn.group(1) if fn else ""))  # end: until closed
            depth += 1
            start = m.end()
        elif ch == "}":
            if transparent and transparent[-1] == depth:
                transparent.pop()
            else:
                depth = max(0, depth - 1)
                if opened is not None and depth == opened[1]:
                    brace, _, head, name = blocks[opened[0]]
                    blocks[opened[0]] = (brace, m.end(), head, name)
                    opened = None
            start = m.end()
        elif depth == 0 or (transparent and transparent[-1] == depth):
            start = m.end()
    return blocks


def defined_functions(code: str) -> list[tuple[int, str]]:
    """(line, name) of each function defined at file scope in C/C++ ``code`` (comments removed, strings
    blanked). ``extern "C" { ... }`` and namespace blocks count as file scope."""
    out = []
    for brace, _, head, name in file_scope_blocks(code):
        if name and "=" not in head.split("(")[0]:
            fn = _HEAD_RE.search(head.rstrip())
            out.append((code.count("\n", 0, brace - len(head) + fn.start()) + 1, name))
    return out


@dataclass
class Views:
    """A candidate's sources in every view, per file."""

    text: dict[str, Lines]
    code: dict[str, Lines]
    definitions: dict[str, Lines]
    includes: dict[str, Lines]


#: A target's preprocessor: candidate -> ({file: [(line, text)]} of the candidate's own lines after
#: preprocessing, {including file: [(line, included path)]} of non-system, non-candidate includes), or None
#: when it cannot preprocess (the compiler then reports the error).
Expander = Callable[[Candidate], "tuple[dict[str, Lines], dict[str, Lines]] | None"]


def views(candidate: Candidate, expand: Expander | None = None) -> Views:
    def stripped(name: str, src: str, keep_strings: bool) -> Lines:
        return _numbered((strip_py if _is_python(name) else strip_c)(src, keep_strings=keep_strings))

    text = {name: stripped(name, src, True) for name, src in candidate.sources.items()}
    expanded = expand(candidate) if expand is not None else None
    if expanded is None:
        code = {name: stripped(name, src, False) for name, src in candidate.sources.items()}
        includes: dict[str, Lines] = {}
    else:
        pre, includes = expanded
        code = {name: [(ln, strip_c(t, keep_strings=False)) for ln, t in lines] for name, lines in pre.items()}
    definitions = {}
    for name, lines in code.items():
        if _is_python(name):
            definitions[name] = [(ln, m.group(1)) for ln, t in lines for m in [re.match(r"(?:async\s+)?def\s+(\w+)", t)]
                                 if m]
            continue
        joined = "\n".join(t for _, t in lines)
        definitions[name] = [(lines[i - 1][0] if 0 < i <= len(lines) else i, fn)
                             for i, fn in defined_functions(joined)]
    return Views(text=text, code=code, definitions=definitions, includes=includes)


def check(candidate: Candidate, rules: tuple[Rule, ...] | list[Rule], expand: Expander | None = None) -> list[Finding]:
    """Every rule match in the candidate's sources, in rule order then file and line order."""
    if not rules:
        return []
    v = views(candidate, expand)
    findings: list[Finding] = []
    for rule in rules:
        if rule.measure is not None:
            from ksearch.eval.static_limits import measure

            findings.extend(measure(rule, candidate, v.code))
            continue
        for name, lines in getattr(v, rule.view).items():
            joined = "\n".join(t for _, t in lines)
            if rule.unless and _compiled(rule.unless).search(joined):
                continue
            for m in rule.regex.finditer(joined):
                idx = joined.count("\n", 0, m.start())
                line_no, line_text = lines[idx] if idx < len(lines) else (idx + 1, m.group())
                original = _original_line(candidate.sources.get(name, ""), line_no) or line_text
                findings.append(Finding(rule.id, name, line_no, original, rule.why))
                break  # one finding per rule and file is enough to reject
    return findings


def _original_line(source: str, line_no: int) -> str:
    lines = source.split("\n")
    return lines[line_no - 1] if 0 < line_no <= len(lines) else ""
