"""Static checks of a candidate's sources before compiling: rules per target, kept as data.

The rules of a target live in ``static_rules/<target>.yaml`` beside this module (see cpu.yaml for the format;
``include: <other>`` puts another file's rules and limits first, as mlx-metal.yaml does with metal.yaml).
Each rule is a regular expression matched against one *view* of the candidate:

- ``text``: each source as written, comments removed, string literals kept;
- ``code``: the candidate's own lines as the compiler sees them (after the preprocessor, when the target can
  run it: macros cannot hide a call), string literal contents blanked;
- ``definitions``: the names of the functions the candidate defines at file scope, one per line;
- ``includes``: files the preprocessor pulled in that are neither the candidate's own nor system headers;
- ``directives``: each preprocessing directive of a C/C++ source as written, ``#name rest``, found the way the
  compiler's first phases find it (trigraphs, splices, comments, ``%:``: `c_scan.directives`);
- ``attributes``: the contents of each ``__attribute__((...))``, ``[[...]]`` and ``__declspec(...)`` of the
  ``code`` view, ``__name__`` read as ``name`` (`c_scan.attributes`);
- ``flags``: the candidate's compile flags, one per line (file ``(compile flags)``).

Python sources (``*.py``, the triton target) get the same views from Python's tokenizer (`strip_py`): ``#``
comments removed, string contents blanked in ``code`` (an f-string's expressions stay visible), backslash
line continuations joined; ``definitions`` are the module's top-level ``def`` names.

A match is a `Finding` (rule, file, line, the line's text, the reason); the evaluator rejects the candidate
with the first one. The checks are a first line, not the only one: the sandbox contains what they miss.

Instead of (or beside) a pattern a rule may give ``names``: identifiers matched wherever they stand in the view
(called, assigned, cast, their address taken, ``std::`` qualified), not as a member (``.x``, ``->x``), and
with the decorations of the C library's own aliases: ``__``/``_``/``__builtin_``/``__isoc99_`` before, ``64``
and then ``_chk``/``_2`` after (``read`` also matches ``__read_chk``, ``open`` matches ``open64`` and
``__open64_2``). An ``allow`` rule (a regular expression) fires on each line of its view that it does not
match in full (the compile flags). ``family`` is a short label of what the rule forbids, used in messages
(`check_artifact` explains a refused linked symbol with the rule whose names match it).

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

from ksearch import yamlio
from ksearch.errors import KsearchError, TargetError
from ksearch.eval import c_scan
from ksearch.eval.c_scan import defined_functions, file_scope_blocks, strip_c  # noqa: F401 - used from here too
from ksearch.records import Candidate

RULES_DIR = Path(__file__).parent / "static_rules"

View = Literal["text", "code", "definitions", "includes", "directives", "attributes", "flags"]
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
    #: identifiers matched wherever they stand (see the module docstring), beside ``pattern``
    names: tuple[str, ...] = ()
    #: a regular expression: the rule fires on each line of the view it does not match in full
    allow: str | None = None
    #: a short label of what the rule forbids ("timers and clocks"), for messages
    family: str = ""
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
    #: the rule family (file) the rule comes from, filled in when the rules load (an included file's rules keep
    #: theirs): the language its limit measures read sizes in (`vector3_padded`)
    dialect: str = ""

    def __init__(self, **data):
        if "in" in data:
            data["view"] = data.pop("in")
        super().__init__(**data)

    @field_validator("pattern", "unless", "allow")
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
        for name in self.names:
            if not re.fullmatch(r"[A-Za-z_$][\w$]*", name):
                raise ValueError(f"rule {self.id!r}: name {name!r} is not a C identifier")
        kinds = [bool(self.pattern or self.names), bool(self.measure), self.allow is not None]
        if sum(kinds) != 1:
            raise ValueError(f"rule {self.id!r}: give a pattern and/or names, or a measure, or allow")
        if self.measure and not self.limit:
            raise ValueError(f"rule {self.id!r}: a measure needs a limit (a key of the file's limits table)")
        if self.measure == "group-memory" and not self.keyword:
            raise ValueError(f"rule {self.id!r}: group-memory needs the declarations' keyword")
        return self

    @property
    def regex(self) -> re.Pattern:
        """The rule's pattern and its names as one regular expression."""
        if not self.names:
            return _compiled(self.pattern)  # as written: it may start with global flags such as (?s)
        parts = [names_pattern(self.names)] + ([self.pattern] if self.pattern else [])
        return _compiled("|".join(f"(?:{p})" for p in parts))


@lru_cache(maxsize=256)
def _compiled(pattern: str) -> re.Pattern:
    return re.compile(pattern, re.MULTILINE)


def names_pattern(names: tuple[str, ...] | list[str]) -> str:
    """A regular expression matching each of ``names`` as an identifier, not as a member, with the C
    library's decorations (see the module docstring): ``names_pattern(["read"])`` matches ``read`` in
    ``&read``, ``(read)(fd, p, n)`` and ``std::read``, and ``__read_chk``; not ``thread``, ``s.read``, ``p->read``."""
    alt = "|".join(sorted({re.escape(n) for n in names}, key=len, reverse=True))
    return (r"(?<![\w$.])(?<!->)(?:__builtin_|__isoc99_|__isoc23_|__|_)?(?:" + alt
            + r")(?:64)?(?:_chk|_2)?(?![\w$.])")


@dataclass(frozen=True)
class Finding:
    """A rule matched: where (``file``, 1-based ``line``), what (``text``, the line) and why.

    ``kind`` is ``source`` for a rule of the sources, ``artifact`` for a check of the built library
    (`check_artifact`): ``text`` is then the message, and ``file``/``line`` where the sources name the symbol
    (``""``/0 when they do not)."""

    rule: str
    file: str
    line: int
    text: str
    why: str
    kind: Literal["source", "artifact"] = "source"

    def __str__(self) -> str:
        if self.kind == "artifact":
            at = f"; {self.file}:{self.line} names it" if self.line else ""
            return f"static check {self.rule!r}: {self.text} ({self.why}){at}"
        return f"static check {self.rule!r}: {self.file}:{self.line}: {self.text.strip()[:160]} ({self.why})"


@lru_cache(maxsize=8)
def _rule_file(target: str) -> tuple[tuple[Rule, ...], dict[str, Limit]]:
    path = RULES_DIR / f"{target}.yaml"
    if not path.is_file():
        return (), {}
    try:
        data = yamlio.safe_load(path.read_text()) or {}
        # ``include: other``: the rules and limits of other.yaml first, then this file's (mlx-metal: metal's)
        base_rules, base_limits = _rule_file(data["include"]) if data.get("include") else ((), {})
        # values from the hardware catalog's limits() of the entry each limit names (the target's reference
        # device: the judge does not pass the run's device to the rules yet), the table's as the fallback
        limits = {**base_limits, **{k: Limit(**v).resolved() for k, v in (data.get("limits") or {}).items()}}
        rules = list(base_rules)
        for r in data.get("rules", []):
            rule = Rule(**r).model_copy(update={"dialect": target})
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


@lru_cache(maxsize=8)
def vector3_padded(family: str) -> bool:
    """Whether three-element vector types take four elements' room in rule family ``family``'s language
    (Metal's float3 / half3; packed_float3 does not): its rule file's top-level ``vector3_padded``, inherited
    through ``include``; False for a family without a file."""
    path = RULES_DIR / f"{family}.yaml"
    if not family or not path.is_file():
        return False
    try:
        data = yamlio.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise TargetError(f"static rules {path} are malformed: {e}") from None
    if "vector3_padded" in data:
        return bool(data["vector3_padded"])
    return vector3_padded(str(data["include"])) if data.get("include") else False


def rules_for(family: str | None) -> tuple[Rule, ...]:
    """The rules of a rule family (``static_rules/<family>.yaml``; a target names its own: `Target.rule_family`):
    empty when there is no such file or ``family`` is None. Raises TargetError on a malformed file."""
    return _rule_file(family)[0] if family else ()


def limits_for(family: str | None) -> dict[str, Limit]:
    """The hard limits a rule family's file declares (``limits``: name -> value and source)."""
    return dict(_rule_file(family)[1]) if family else {}


# -- views ------------------------------------------------------------------------------------------------

#: One file of a view: (1-based line number in the candidate's file, text) per line.
Lines = list[tuple[int, str]]


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


@dataclass
class Views:
    """A candidate's sources in every view, per file."""

    text: dict[str, Lines]
    code: dict[str, Lines]
    definitions: dict[str, Lines]
    includes: dict[str, Lines]
    directives: dict[str, Lines]
    attributes: dict[str, Lines]
    flags: dict[str, Lines]


#: the file name the ``flags`` view files the compile flags under
FLAGS_FILE = "(compile flags)"


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
    directives = {name: c_scan.directives(src) for name, src in candidate.sources.items() if not _is_python(name)}
    attributes = {}
    for name, lines in code.items():
        if not _is_python(name):
            joined = "\n".join(t for _, t in lines)
            attributes[name] = [(lines[i][0] if i < len(lines) else i + 1, a) for i, a in c_scan.attributes(joined)]
    flags = {FLAGS_FILE: [(i + 1, f) for i, f in enumerate(candidate.compile_flags)]}
    return Views(text=text, code=code, definitions=definitions, includes=includes, directives=directives,
                 attributes=attributes, flags=flags)


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
            if rule.allow is not None:
                allowed = _compiled(rule.allow)
                bad = next(((ln, t) for ln, t in lines if not allowed.fullmatch(t)), None)
                if bad is not None:
                    findings.append(Finding(rule.id, name, bad[0], _original_line(candidate.sources.get(name, ""),
                                                                                  bad[0]) or bad[1], rule.why))
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


def check_artifact(target: str | None, artifact: Path, candidate: Candidate) -> list[Finding]:
    """What the built library ``artifact`` of ``candidate`` links and runs at load, against the symbol policy of
    rule family ``target`` (`Target.rule_family`; ``static_rules/<target>.symbols.yaml``, `linked_symbols`; None:
    no policy): the undefined dynamic symbols,
    the libraries, the load-time entries and the layout. Call it after a successful compile, before the
    library is loaded. Returns the findings (kind ``artifact``), [] when all pass or the target has no policy;
    a file that cannot be parsed as ELF is one finding (rule ``binary-layout``). Raises TargetError when the
    policy file is malformed, OSError when the artifact cannot be read at all."""
    from ksearch.eval import linked_symbols

    policy = linked_symbols.policy_for(target) if target else None
    if policy is None or target is None:
        return []
    try:
        facts = linked_symbols.read_elf(Path(artifact))
    except OSError:
        raise
    except Exception as e:  # noqa: BLE001 - pyelftools raises ELFError, ValueError, struct.error... on bad input
        return [Finding("binary-layout", "", 0, f"the built library {Path(artifact).name} cannot be read as ELF",
                        f"{type(e).__name__}: {e}", kind="artifact")]
    return linked_symbols.check(policy, facts, candidate, rules_for(target), target)
