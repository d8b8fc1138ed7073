"""A node's kernel as text: its sources with how it is built and launched, and the unified diff from its
parent's kernel (what `ksearch show RUN --node ID --source` and ``--diff`` print)."""

from __future__ import annotations

import difflib
import json

from ksearch.records import Candidate


def _build(c: Candidate) -> list[str]:
    """The settings that make a binary of the sources besides their text: entry point, compile flags (added to
    the target's own), launch plan (empty on the CPU)."""
    return [f"entry point: {c.entry_point}", f"compile flags: {' '.join(c.compile_flags) or '(none)'}",
            f"launch plan: {json.dumps(c.launch, sort_keys=True) if c.launch else '(none)'}"]


def source_text(c: Candidate) -> str:
    """Every source file of the candidate under a ``==> NAME <==`` header, after its build settings
    (``# entry point: run`` ...) and its content id."""
    out = [f"# candidate {c.id} · target {c.target}", *(f"# {line}" for line in _build(c))]
    for name, text in c.sources.items():
        out += [f"==> {name} <==", text.rstrip("\n")]
    return "\n".join(out) + "\n"


def candidate_diff(parent: Candidate | None, child: Candidate, parent_name: str, child_name: str) -> str:
    """The unified diff (3 lines of context) from ``parent``'s kernel to ``child``'s, build settings first (as a
    file ``build``), then each source file by name (a file only one side has is added or removed whole); "" when
    the two build the same kernel. ``parent`` None: everything is added."""
    out: list[str] = []
    before = {"build": _build(parent)} if parent else {}
    before.update({k: v.splitlines() for k, v in (parent.sources if parent else {}).items()})
    after = {"build": _build(child), **{k: v.splitlines() for k, v in child.sources.items()}}
    for name in dict.fromkeys([*after, *before]):
        out += difflib.unified_diff(before.get(name, []), after.get(name, []), f"{parent_name}/{name}",
                                    f"{child_name}/{name}", lineterm="")
    return "\n".join(out) + ("\n" if out else "")
