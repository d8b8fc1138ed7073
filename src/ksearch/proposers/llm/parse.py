"""Reading model replies: the planner's JSON array of tree edits, the coder's fenced source blocks.

Both readers are strict about structure and lenient about the prose around it, and neither rewrites what it
takes: a code block is the exact text between its fence lines, a JSON array is decoded as written.

- `extract_json_array`: one JSON array, in a ```json (or bare ```) fence or bare in the text, prose around it
  allowed; a single edit object or ``{"edits": [...]}`` is accepted as well. Raises `ReplyError` (what to tell
  the model) when there is none, when it does not decode (truncated, garbage) or when there are several.
- `check_edits`: each decoded item through `ksearch.search.edits.parse_edit`; returns the records and one
  message per item that is not an edit.
- `extract_code`: the kernel's files for a target (``kernel.c`` / ``kernel.cpp`` for cpu, ``kernel.cu`` plus the
  launch plan from a ```yaml block for cuda, ``kernel.py`` for triton). Raises `ReplyError` (a KnowledgeError, so
  the controller records the node as failed with this message) when a block is missing, a fence is left open, or
  the reply was cut at the token limit before the blocks it needs were complete.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from ksearch.errors import Rejected, ReplyError, TaskError
from ksearch.llm.base import is_truncated
from ksearch.search.edits import Choose, Delete, Insert, Retime, Split, Update, parse_edit
from ksearch.targets import get_target, target_names
from ksearch.targets.base import aliases
from ksearch.tasks.validate import parse_mapping


YAML_LANGS = frozenset({"yaml", "yml"})
#: the fence language of a coder's compile flags (`ksearch.targets.base.Target.flags_help`)
FLAGS_LANG = "flags"
#: brackets of a reply tried as the start of a bare JSON array (bounds the work on garbage)
MAX_SCAN = 500

_OPEN = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*?)[ \t]*$")
_NAME = re.compile(r"^(?:(?:file(?:name)?|title|name|path)=)?[\"']?(?P<name>[\w.\-/]+\.[A-Za-z0-9+]+)[\"']?$")


@dataclass(frozen=True)
class Fence:
    """One fenced block: ``lang`` (lower case, "" when none), ``name`` (a file name in the info string, else
    None), ``body`` (the exact text between the fence lines), ``closed`` (False: the reply ended inside it)."""

    lang: str
    name: str | None
    body: str
    closed: bool
    line: int = 0


def fences(text: str) -> list[Fence]:
    """Every fenced block of a Markdown reply, in order. A fence opens with three or more backticks or tildes
    (indented at most 3 spaces) and an info string, and closes with a line of at least as many of the same
    character and nothing else; the body is kept byte for byte (no dedent, no stripping)."""
    out: list[Fence] = []
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        m = _OPEN.match(lines[i].rstrip("\r\n"))
        if not m:
            i += 1
            continue
        fence, info = m["fence"], m["info"]
        words = info.replace(",", " ").split()
        lang = words[0].lower() if words else ""
        if ":" in lang and not words[1:]:  # ```c:kernel.c
            lang, _, rest = lang.partition(":")
            words = [lang, rest]
        name = next((n["name"] for w in words[1:] if (n := _NAME.match(w))), None)
        if name is None and words and _NAME.match(words[0]) and "." in words[0]:  # ```kernel.c
            name, lang = words[0], words[0].rsplit(".", 1)[1].lower()
        close = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j].rstrip("\r\n")):
            j += 1
        body = "".join(lines[i + 1:j])
        out.append(Fence(lang=lang, name=name, body=body, closed=j < len(lines), line=i + 1))
        i = j + 1
    return out


# -- the planner's edits -----------------------------------------------------------------------------


def _loads(text: str) -> Any:
    """json.loads, with nesting too deep for the decoder reported as a JSONDecodeError."""
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("brackets nested too deep", text, 0) from None


def _as_items(value: Any) -> list | None:
    """The edit list a decoded JSON value stands for, or None when it is not one."""
    if isinstance(value, list):
        return value
    if isinstance(value, dict):
        if isinstance(value.get("edits"), list):
            return value["edits"]
        if "op" in value:
            return [value]
    return None


def _scan(text: str) -> tuple[list | None, str | None]:
    """The first JSON array (or edit object) that decodes at a '[' or '{' of ``text``; else (None, the decode
    error at the first bracket, which is what a truncated or garbled array shows)."""
    decoder = json.JSONDecoder()
    first_error = None
    for k, m in enumerate(re.finditer(r"[\[{]", text)):
        if k >= MAX_SCAN:
            break
        try:
            value, _ = decoder.raw_decode(text, m.start())
        except json.JSONDecodeError as e:
            if first_error is None:
                first_error = f"{e.msg} at line {e.lineno} column {e.colno}"
            continue
        except RecursionError:
            first_error = first_error or "brackets nested too deep"
            continue
        items = _as_items(value)
        if items is not None and (items == [] or any(isinstance(x, dict) for x in items)):
            return items, None
    return None, first_error


def extract_json_array(text: str, finish_reason: str | None = None) -> list:
    """The planner's edit list from a reply (see the module docstring).

    Args:
        text: the reply.
        finish_reason: the provider's stop reason; "length"/"max_tokens" adds that the reply was cut.

    Returns:
        The decoded items (normally dicts with an ``op``), as written.

    Raises:
        ReplyError: no array, an array that does not decode (the decoder's message and position), or more than
            one fenced array.
    """
    cut = " (the reply was cut at the token limit: send fewer or shorter edits)" if is_truncated(finish_reason) else ""
    blocks = [f for f in fences(text) if f.lang in ("json", "jsonc", "json5", "")]
    found: list[list] = []
    errors: list[str] = []
    for f in blocks:
        body = f.body.strip()
        if not body:
            continue
        try:
            value = _loads(body)
        except json.JSONDecodeError as e:
            where = "an unclosed ```json block" if not f.closed else f"the ```json block at line {f.line}"
            errors.append(f"{where} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}")
            continue
        items = _as_items(value)
        if items is None:
            errors.append(f"the ```json block at line {f.line} holds a JSON {type(value).__name__}, "
                          "not an array of edits")
            continue
        found.append(items)
    if len(found) > 1:
        raise ReplyError(f"the reply holds {len(found)} JSON arrays in fences; send exactly one array with every "
                         "edit in it")
    if found:
        return found[0]
    if errors:
        raise ReplyError(errors[0] + cut)
    stripped = text.strip()
    if stripped:
        try:
            items = _as_items(_loads(stripped))
            if items is not None:
                return items
        except json.JSONDecodeError:
            pass
    items, error = _scan(text)
    if items is not None:
        return items
    if error:
        raise ReplyError(f"the JSON array in the reply does not decode: {error}{cut}")
    raise ReplyError(f"the reply holds no JSON array of edits{cut}")


Edit = Insert | Update | Split | Delete | Retime | Choose


def check_edits(items: list) -> tuple[list[tuple[int, Edit]], list[tuple[int, str]]]:
    """Parse each item as an edit record (`ksearch.search.edits.parse_edit`).

    Returns:
        ((index, edit) for the items that parse, (index, message) for each item that does not, e.g. (3,
        "edit 3 (insert): malformed edit: action.title: Field required (got ...)")).
    """
    good: list[tuple[int, Edit]] = []
    bad: list[tuple[int, str]] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            bad.append((i, f"edit {i}: not an object (got {json.dumps(item)[:60]})"))
            continue
        try:
            good.append((i, parse_edit(item)))
        except Rejected as e:
            bad.append((i, f"edit {i} ({item.get('op', '?')}): {e}"))
    return good, bad


# -- the coder's kernel --------------------------------------------------------------------------------


@dataclass
class CodeReply:
    """What `extract_code` took from a reply: ``sources`` (file name -> text, as written), ``launch`` (the
    cuda launch plan from the ```yaml block, else {}), ``notes`` (what was set aside, e.g. earlier blocks of
    the same file)."""

    sources: dict[str, str]
    launch: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: the compile flags of the reply's ```flags block (split at whitespace), None without one
    compile_flags: list[str] | None = None


def _found(fs: list[Fence]) -> str:
    langs = sorted({f"```{f.lang}" if f.lang else "``` (no language)" for f in fs})
    return f"found {', '.join(langs)}" if langs else "found no fenced block"


def extract_code(text: str, target: str, finish_reason: str | None = None) -> CodeReply:
    """The kernel's source files (and the cuda launch plan) from a coder reply, taken as written.

    One block per source file: ```c (kernel.c) or ```cpp (kernel.cpp) for cpu; ```cuda or ```cpp (kernel.cu)
    plus one ```yaml launch plan for cuda; ```python (kernel.py) for triton. A file name in the info string
    (```cuda kernel.cu, ```c title=kernel.c) names the file. When several unnamed blocks of the same language
    are present the last one is taken (the reply format asks for one; the others are noted).

    Args:
        text: the reply.
        target: the target's name (its fence languages, file suffixes and launch plan: `ksearch.targets.base.Target`).
        finish_reason: the provider's stop reason. A reply cut at the token limit is refused unless every block
            it needs is complete (closed) before the cut.

    Raises:
        ReplyError: unknown target, a missing block (names what was found), a block left open (a truncated
            reply), an unreadable launch plan.
    """
    concrete = [n for n in target_names() if n not in aliases()]  # an alias (mlx) is resolved before
    if target not in concrete:
        raise ReplyError(f"the llm coder writes kernels for {', '.join(concrete)}, not for target {target!r}")
    t = get_target(target)
    langs, suffixes = t.fence_files, tuple(t.source_suffixes)
    main = t.fence_lang
    cut = is_truncated(finish_reason)
    all_fences = fences(text)
    wanted = set(langs) | (YAML_LANGS if t.takes_launch else set())
    unclosed = [f for f in all_fences if not f.closed]
    open_fences = [f for f in unclosed if f.lang in wanted or (f.name or "").endswith(suffixes)]
    all_fences = [f for f in all_fences if f.closed]
    if open_fences:
        f = open_fences[0]
        why = f"the token limit (finish_reason {finish_reason!r})" if cut else "the end of the reply"
        raise ReplyError(f"truncated reply: the ```{f.lang or ''} block opened at line {f.line} is not closed "
                         f"before {why}; no kernel taken")
    sources: dict[str, str] = {}
    notes: list[str] = []
    unnamed: dict[str, list[Fence]] = {}
    for f in all_fences:
        if f.name and f.name.endswith(suffixes):
            if "/" in f.name or f.name.startswith("."):
                raise ReplyError(f"source file name {f.name!r} must be a plain file name")
            sources[f.name] = f.body
        elif f.lang in langs:
            unnamed.setdefault(langs[f.lang], []).append(f)
    for name, blocks in unnamed.items():
        if name in sources:
            notes.append(f"{len(blocks)} unnamed ```{blocks[0].lang} block(s) ignored: {name} came as a named block")
            continue
        sources[name] = blocks[-1].body
        if len(blocks) > 1:
            notes.append(f"{len(blocks)} ```{blocks[-1].lang} blocks: took the last (line {blocks[-1].line})")
    alternatives = sorted(set(langs.values()) & set(sources))  # kernel.c and kernel.cpp: one kernel, two ways
    if len(alternatives) > 1:
        kinds = " and a ".join(f"```{next(lang for lang, f in langs.items() if f == name)}" for name in alternatives)
        raise ReplyError(f"the reply holds both a {kinds} kernel; send one kernel in one block")
    if not sources:
        why = f"; the reply was cut at the token limit (finish_reason {finish_reason!r})" if cut else ""
        if unclosed:
            why += f"; the ```{unclosed[0].lang} block opened at line {unclosed[0].line} is not closed"
        raise ReplyError(f"no ```{main} block with the kernel in the reply ({_found(all_fences)}){why}")
    if any(not body.strip() for body in sources.values()):
        raise ReplyError(f"an empty ```{main} block: no kernel in the reply")
    compile_flags = None
    flag_blocks = [f for f in all_fences if f.lang == FLAGS_LANG]
    if flag_blocks and t.flags_help is None:
        notes.append(f"a ```{FLAGS_LANG} block ignored: {target} kernels take no compile flags")
    elif flag_blocks:
        compile_flags = flag_blocks[-1].body.split()
        if any("\x00" in f for f in compile_flags):  # no program takes one in its arguments
            raise ReplyError("the ```flags block holds a NUL character")
    launch: dict[str, Any] = {}
    if t.takes_launch:
        plans = [f for f in all_fences if f.lang in YAML_LANGS]
        if not plans:
            why = f"; the reply was cut at the token limit (finish_reason {finish_reason!r})" if cut else ""
            raise ReplyError(f"no ```yaml launch plan in the reply ({_found(all_fences)}): a {target} kernel needs "
                             f"one (docs/cuda-target.md, docs/mlx-target.md){why}")
        if len(plans) > 1:
            notes.append(f"{len(plans)} ```yaml blocks: took the last (line {plans[-1].line})")
        try:  # bounded: no alias cycle (a launch plan is hashed as JSON) or alias bomb, no deep nesting
            plan = parse_mapping(plans[-1].body, "the ```yaml launch plan", as_json=False)
        except TaskError as e:
            raise ReplyError(str(e)) from None
        if not isinstance(plan, dict):
            raise ReplyError(f"the ```yaml launch plan must be a mapping with 'launches', got {type(plan).__name__}")
        launch = plan
    return CodeReply(sources=sources, launch=launch, notes=notes, compile_flags=compile_flags)
