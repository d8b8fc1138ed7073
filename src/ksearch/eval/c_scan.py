"""C and C++ source the way the compiler's first translation phases read it, for the static checks.

Two views of `static_checks` come from here:

- ``directives``: every preprocessing directive of a source, spelled ``#name rest``. A directive is found the
  way the C standard's phases 1-3 (ISO C11 5.1.1.2) and GCC's lexer find it: trigraphs (``??=`` is ``#``,
  ``??/`` a backslash) when the dialect honours them, a backslash before a newline joining lines (GCC also
  joins when only blanks separate the two, with a warning), comments as one space (a block comment may run
  over lines inside a directive), ``%:`` the digraph of ``#``, a NUL byte a blank, a byte-order mark at the
  start ignored, a lone carriage return a newline (all checked against gcc 12's ``-E``). Whether trigraphs and
  blank-separated splices apply depends on flags the scan cannot settle, so every combination is scanned and
  the union kept: a directive the compiler sees is always listed; a listed one may be an unused spelling (a
  ``#line`` inside a block comment), which an honest kernel does not write.
- ``attributes``: the contents of each ``__attribute__((...))``, ``[[...]]`` and ``__declspec(...)`` of the
  preprocessed code, parentheses balanced whatever their depth, names written ``__name__`` read as ``name``
  (GCC takes both), so ``__attribute__((aligned((8)), __constructor__))`` reads ``aligned((8)), constructor``.

Also the C scanning the other views use: `strip_c` (comments out, strings blanked or kept), `file_scope_blocks`
and `defined_functions` (the ``definitions`` view and the limit checks' function spans).
"""

from __future__ import annotations

import re

#: one line of a view: (1-based line number in the candidate's file, text)
Line = tuple[int, str]

TRIGRAPHS = {"=": "#", "/": "\\", "'": "^", "(": "[", ")": "]", "!": "|", "<": "{", ">": "}", "-": "~"}
_TRIGRAPH = re.compile(r"\?\?([=/'()!<>-])")
_BLANK = r"[ \t\f\v\x00]"  # GCC ignores NUL bytes in source, as blanks
_GAP = rf"(?:{_BLANK}|/\*.*?\*/)*"
_DIRECTIVE = re.compile(rf"^{_GAP}(?:#|%:){_GAP}([A-Za-z_]\w*|\d+)?([^\n]*)", re.MULTILINE | re.DOTALL)


def physical(source: str) -> str:
    """``source`` with a leading byte-order mark dropped and every line ending (CR LF, CR, LF) a LF."""
    return source.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")


def splice(text: str, lax: bool = False) -> str:
    """Phase 2: each backslash-newline (``lax``: backslash, blanks, newline, as GCC takes it) removed, joining
    the lines; as many empty lines go after the joined line, so every later line keeps its number."""
    tail = re.compile(rf"\\{_BLANK}*$" if lax else r"\\$")
    lines = text.split("\n")
    out: list[str] = []
    held, owed = "", 0
    for i, line in enumerate(lines):
        m = tail.search(line)
        if m and i < len(lines) - 1:
            held, owed = held + line[:m.start()], owed + 1
            continue
        out += [held + line] + [""] * owed
        held, owed = "", 0
    return "\n".join(out)


def directives(source: str) -> list[Line]:
    """(line, ``#name rest``) of every preprocessing directive in C/C++ ``source``, under each reading of
    trigraphs and splices (see the module docstring); ``rest`` has its comments blanked and its blanks
    collapsed. A null directive (``#`` alone) reads ``#``."""
    found: set[Line] = set()
    base = physical(source)
    for trigraphs in (False, True):
        text = _TRIGRAPH.sub(lambda m: TRIGRAPHS[m.group(1)], base) if trigraphs else base
        for lax in (False, True):
            joined = splice(text, lax)
            for m in _DIRECTIVE.finditer(joined):
                rest = re.sub(r"/\*.*?\*/|//.*", " ", m.group(2), flags=re.DOTALL)
                rest = re.sub(rf"{_BLANK}+", " ", rest).strip()
                found.add((joined.count("\n", 0, m.start()) + 1, f"#{m.group(1) or ''} {rest}".rstrip()))
    return sorted(found)


_ATTRIBUTE_START = re.compile(r"\b__attribute(?:__)?\s*\(|\[\s*\[|\b__declspec\s*\(")


def attributes(code: str) -> list[tuple[int, str]]:
    """(0-based line index in ``code``, contents) of each attribute in C/C++ ``code`` (comments removed,
    strings blanked): ``__attribute__((...))`` and ``__attribute((...))`` (the outer parentheses dropped),
    ``[[...]]`` (also spelled with the digraphs ``<:`` ``:>``) and ``__declspec(...)``. An attribute never
    closed runs to the end of the code."""
    code = code.replace("<:", "[ ").replace(":>", "] ")  # the digraphs of [ and ]: <:<:gnu::constructor:>:>
    out = []
    for m in _ATTRIBUTE_START.finditer(code):
        opener = code[m.end() - 1]
        close = "]" if opener == "[" else ")"
        depth, i = 1, m.end()
        while i < len(code) and depth:
            if code[i] == opener:
                depth += 1
            elif code[i] == close:
                depth -= 1
            i += 1
        inner = code[m.end():i - 1 if depth == 0 else i]
        if opener == "(" and m.group().startswith("__attribute"):
            inner = inner.strip()
            inner = inner[1:-1] if inner.startswith("(") and inner.endswith(")") else inner
        inner = re.sub(r"\b__(\w+?)__\b", r"\1", inner)
        out.append((code.count("\n", 0, m.start()), re.sub(r"\s+", " ", inner).strip()))
    return out


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


_HEAD_RE = re.compile(r"(~?[A-Za-z_]\w*)\s*\((?:[^()]|\([^()]*\))*\)\s*(?:const\b|noexcept\b|__attribute__\s*\(\(.*?\)\)\s*)*$",
                      re.DOTALL)
_OPEN_NO_DEPTH = re.compile(r"(\bextern\s*\"\s*\"|\bnamespace\b[^;{}]*)\s*$")


def file_scope_blocks(code: str) -> list[tuple[int, int, str, str]]:
    """(opening brace offset, closing brace end offset, head, function name or "") of each brace block at file
    scope in C/C++ ``code`` (comments removed, strings blanked). ``extern "C" { ... }`` and namespace blocks are
    walked into: what they hold counts as file scope. ``head`` is the text between the previous ``;``/``}``/``{``
    at that level and the block; the name is "" when the head is not a function signature. A block never closed
    (unbalanced source) runs to the end of the code."""
    blocks: list[tuple[int, int, str, str]] = []
    transparent: list[int] = []
    depth, start = 0, 0
    opened: tuple[int, int] | None = None  # (index in blocks, depth) of the file-scope block open now
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
            at = fn.start() if fn else 0
            out.append((code.count("\n", 0, brace - len(head) + at) + 1, name))
    return out
