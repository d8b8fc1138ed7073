"""Text a candidate controls, made safe to quote in a prompt: bounded, cleaned, and fenced as data.

A kernel can print anything to stderr, raise any exception text (a Triton candidate is Python), and make the
compiler quote any line of its source; the judge's messages quote all of these. Every such piece of text goes
through `Untrusted.of` before a template sees it, and is written into the prompt only as a fenced block
(`fence`; the template environment of `ksearch.proposers.llm.context` does it for every ``{{ value }}`` that is an
`Untrusted`, and refuses to format one any other way). What `Untrusted.of` does, in order:

1. decode: bytes as UTF-8 with U+FFFD for invalid sequences; lone surrogates in a str (``surrogateescape``
   decoding) become U+FFFD too (an API request could not encode them);
2. pre-cut: of a text longer than 8 budgets only the first and last 4 budgets are looked at (10 MB of output
   costs what 32 KB does);
3. clean: ECMA-48 escape sequences removed (CSI ``ESC [ ... final``, its 8-bit form, the control strings OSC,
   DCS, SOS, PM and APC up to their terminator, two-character escapes); CR LF, lone CR, NEL and the Unicode
   line and paragraph separators become LF; every other control character (C0 but TAB and LF, DEL, C1) and
   every format, private-use and unassigned code point (bidirectional overrides, zero-width characters, the
   tag characters that can smuggle invisible text to a model) removed;
4. defang: the word "untrusted" (any case) is written "un-trusted", so the text can never hold a line that
   looks like a fence marker (step 3 runs first: a NUL or zero-width space inside the word does not hide it);
5. bound: lines are kept from the head and the tail within the source's character budget (a line costs its
   length + 3: the ``| `` prefix and the newline; a line longer than what is left is cut when at least
   MIN_PIECE characters are left), with one line between saying how many characters were not shown.

`fence` writes the block as::

    <<<UNTRUSTED 0123456789abcdef: compiler output>>>
    | kernel.c:3:5: error: 'h' undeclared
    <<<END UNTRUSTED 0123456789abcdef>>>

The id is the first 16 hex digits of SHA-256 over the source's label and the shown lines, so the same text
gives the same prompt (a resumed run's replay of recorded calls matches prompts by their hash,
`ksearch.llm.base.prompt_hash`), while a text that tried to carry its own closing line would have to contain
the hash of itself (a 64-bit fixed point). Step 4 makes that moot: no shown line can contain the marker word,
and every shown line starts with ``| ``, so a fake section header inside the block never starts a line.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass

#: what the fences look like, for the system prompts (``prompts/_untrusted.j2``)
OPEN_MARK, CLOSE_MARK, LINE_PREFIX = "<<<UNTRUSTED", "<<<END UNTRUSTED", "| "
#: digits of the block id
ID_DIGITS = 16
#: a text longer than PRECUT budgets is looked at only in its first and last PRECUT / 2 budgets
PRECUT = 8
#: the shortest piece of a line that does not fit whole which is still shown (characters)
MIN_PIECE = 40


@dataclass(frozen=True)
class Source:
    """Where a quoted text came from and how much of it a prompt keeps.

    Attributes:
        label: shown in the fence's opening line ("compiler output").
        budget: characters the shown lines may take, each line counted with its ``| `` prefix and newline
            (the cut line and the two markers not counted).
        head: the share of the budget kept from the start of the text (the rest from its end).
    """

    label: str
    budget: int
    head: float


#: compiler output: the first error is at the head, the count of errors at the tail
COMPILER = Source("compiler output", 4000, 0.75)
#: the evaluation's message: judge text that can quote the kernel's stderr (a dead worker's last 1500
#: characters, `ksearch.eval.evaluator`), its exception or the compiler; the end of a stderr tail is the crash
JUDGE = Source("the judge's message, which can quote the kernel's stderr and errors", 2500, 0.4)
#: one workload's message: judge text that can quote the kernel's exception on that workload
WORKLOAD = Source("the judge's message on this workload, which can quote the kernel's errors", 1500, 0.5)
#: a profiler's or compiler report's notes on a passing kernel (`ksearch.records.Profile`): they quote its source
#: lines and kernel names; the first lines are the tool's summary
PROFILER = Source("the profiler's and compiler's notes on this kernel, which can quote its source", 1500, 0.7)
#: why the coder's reply gave no kernel (`ksearch.errors.ReplyError`; it can quote names from the reply)
NO_KERNEL = Source("why the coder's reply held no kernel", 800, 0.5)

#: ECMA-48 (5th ed., 1991) sequences: CSI (7- and 8-bit) with parameter, intermediate and final bytes; the
#: control strings OSC, DCS, SOS, PM, APC up to BEL or ST (at most 1024 characters, so a text full of
#: unterminated openers stays linear); an ESC with intermediates and a final byte. Leftover lone ESCs go with
#: the other control characters.
_ESCAPES = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]{0,1024}(?:\x07|\x1b\\|\x9c)"
    r"|\x1b[ -/]*[0-~]")
_NEWLINES = str.maketrans({"\r": "\n", "\x85": "\n", "\u2028": "\n", "\u2029": "\n"})
_ASCII_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_NON_ASCII = re.compile(r"[^\x00-\x7f]")
_MARKER_WORD = re.compile(r"(un)(trusted)", re.IGNORECASE)
_DROPPED_CATEGORIES = {"Cc", "Cf", "Co", "Cn"}


def _non_ascii(m: re.Match) -> str:
    ch = m.group()
    cat = unicodedata.category(ch)
    if cat == "Cs":
        return "\ufffd"
    if cat in _DROPPED_CATEGORIES or 0xE0100 <= ord(ch) <= 0xE01EF:  # + variation selectors supplement
        return ""
    return ch


def clean(text: str) -> str:
    """``text`` without escape sequences and control, format, private-use or unassigned characters, newlines
    as LF, and the marker word defanged (steps 3 and 4 of the module docstring). Tabs and newlines stay."""
    text = _ESCAPES.sub("", text).replace("\r\n", "\n").translate(_NEWLINES)
    text = _ASCII_CONTROLS.sub("", text)
    if not text.isascii():
        text = _NON_ASCII.sub(_non_ascii, text)
    return _MARKER_WORD.sub(r"\1-\2", text)


def _take(lines: list[str], budget: int) -> list[str]:
    """Lines from the start of ``lines`` whose cost (length + 3 each) fits ``budget``; the first line that
    does not fit is cut to what is left when that is at least MIN_PIECE characters or no line fitted whole."""
    out, used = [], 0
    for line in lines:
        if used + len(line) + 3 <= budget:
            out.append(line)
            used += len(line) + 3
            continue
        room = budget - used - 3
        if room >= MIN_PIECE or (room > 0 and not out):
            out.append(line[:room])
        break
    return out


@dataclass(frozen=True)
class Untrusted:
    """A candidate-controlled text, cleaned and bounded, waiting to be fenced in a prompt (`fence`).

    Attributes:
        source: where it came from and its budget.
        lines: the lines to show (without the ``| `` prefix); the cut line, when there is one, among them.
        total: characters of the text as received (after decoding, before cleaning).
        cut: whether the budget cut the text (not counting what cleaning removed).
    """

    source: Source
    lines: tuple[str, ...]
    total: int
    cut: bool

    @classmethod
    def of(cls, text: str | bytes | None, source: Source) -> Untrusted:
        """Decode, clean and bound ``text`` for ``source`` (module docstring, steps 1 to 5); None is ""."""
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8", errors="replace")
        text = text or ""
        total = len(text)
        window = PRECUT * source.budget
        if total > window:
            head_text, tail_text = clean(text[: window // 2]), clean(text[-(window // 2):])
        else:
            head_text = tail_text = clean(text)
        head_text, tail_text = head_text.strip("\n"), tail_text.strip("\n")
        head_lines = head_text.split("\n") if head_text else []
        if total <= window and sum(len(ln) + 3 for ln in head_lines) <= source.budget:
            return cls(source, tuple(head_lines), total, False)
        head_budget = int(source.budget * source.head)
        head = _take(head_lines, head_budget)
        tail_lines = tail_text.split("\n") if tail_text else []
        tail = [ln[::-1] for ln in _take([ln[::-1] for ln in reversed(tail_lines)], source.budget - head_budget)]
        tail.reverse()
        shown = sum(len(ln) for ln in head) + sum(len(ln) for ln in tail) + max(0, len(head) + len(tail) - 1)
        note = f"[... {max(0, total - shown):,} of {total:,} characters not shown ...]"
        return cls(source, (*head, note, *tail), total, True)

    def __bool__(self) -> bool:
        return any(ln.strip() for ln in self.lines)

    def __str__(self) -> str:
        raise TypeError("an Untrusted text goes into a prompt only as a fenced block: write {{ value }} on a line "
                        "of its own in the template (context.render fences it), or call untrusted.fence")

    @property
    def id(self) -> str:
        """16 hex digits of SHA-256 over the label and the shown lines (see the module docstring)."""
        blob = "\0".join((self.source.label, *self.lines)).encode("utf-8", errors="replace")
        return hashlib.sha256(blob).hexdigest()[:ID_DIGITS]


def fence(u: Untrusted) -> str:
    """The block as it goes into a prompt: the opening marker with the id and the label, every shown line
    prefixed with ``| ``, the closing marker with the same id (no trailing newline)."""
    body = [LINE_PREFIX + ln for ln in u.lines]
    return "\n".join([f"{OPEN_MARK} {u.id}: {u.source.label}>>>", *body, f"{CLOSE_MARK} {u.id}>>>"])


def finalize(value):
    """Jinja's ``finalize`` hook: an `Untrusted` value becomes its fenced block; anything else is left as is."""
    return fence(value) if isinstance(value, Untrusted) else value
