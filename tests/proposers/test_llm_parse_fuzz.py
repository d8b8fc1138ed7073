"""Fuzzing the readers of model replies (`ksearch.proposers.llm.parse`): the planner's edits and the coder's
fenced blocks, for every target. Whatever a model writes, the only exception is `ReplyError` (what the proposer
sends back to the model), nothing hangs; a fixed, derandomized example budget keeps CI deterministic."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ksearch.errors import ReplyError
from ksearch.proposers.llm.parse import check_edits, extract_code, extract_json_array, fences
from ksearch.records import Candidate
from ksearch.targets.base import aliases
from ksearch.targets import target_names

FUZZ = settings(max_examples=60, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TARGETS = [n for n in target_names() if n not in aliases()]

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                             st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                           max_leaves=10)
edit = st.fixed_dictionaries(
    {"op": st.sampled_from(["insert", "update", "split", "delete", "retime", "choose", "move", ""])},
    optional={"parent_id": st.sampled_from(["root", "n1", "", "x" * 300]), "id": st.text(max_size=10),
              "node_id": st.text(max_size=10), "decision": st.text(max_size=10), "choice": st.text(max_size=10),
              "rating": st.one_of(st.integers(-5, 15), st.floats()), "confidence": st.one_of(st.floats(), scalars),
              "action": st.one_of(st.fixed_dictionaries({"title": st.text(max_size=10)},
                                                        optional={"description": st.text(max_size=10),
                                                                  "difficulty": st.integers(-3, 9)}), json_values),
              "impacts": json_values, "children": json_values})
fence_lang = st.sampled_from(["", "json", "c", "cpp", "cuda", "python", "yaml", "flags", "metal", "c kernel.c",
                              "cuda title=kernel.cu", "python kernel.py", "yaml launch", "~~~"])
body = st.one_of(st.text(max_size=60), st.lists(edit, max_size=3).map(json.dumps), json_values.map(json.dumps),
                 st.sampled_from(["grid: [1, 1, 1]\nblock: [128, 1, 1]\n", "a: &a [*a]", "[" * 1100,
                                  "void run(const float *x, float *y, long n) {}", "def run(*a):\n    pass\n"]))


@st.composite
def replies(draw):
    """Prose and fenced blocks in any order, fences sometimes left open or mismatched."""
    parts = []
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["prose", "fence", "open", "bare"]))
        if kind == "prose":
            parts.append(draw(st.text(max_size=40)))
        elif kind == "bare":
            parts.append(draw(body))
        else:
            tick = draw(st.sampled_from(["```", "~~~", "````", "``"]))
            text = f"{tick}{draw(fence_lang)}\n{draw(body)}\n"
            parts.append(text + (tick if kind == "fence" else ""))
    return "\n".join(parts)


@FUZZ
@given(text=st.one_of(replies(), st.text(max_size=300)), finish=st.sampled_from([None, "stop", "length"]))
def test_planner_replies(text, finish):
    try:
        items = extract_json_array(text, finish)
    except ReplyError:
        return
    assert isinstance(items, list)
    good, bad = check_edits(items)  # never raises: one message per item that is not an edit
    assert len(good) + len(bad) == len(items)


@FUZZ
@given(text=st.one_of(replies(), st.text(max_size=300)), target=st.sampled_from(TARGETS),
       finish=st.sampled_from([None, "length"]))
def test_coder_replies(text, target, finish):
    fences(text)
    try:
        reply = extract_code(text, target, finish)
    except ReplyError:
        return
    assert reply.sources and all(isinstance(v, str) for v in reply.sources.values())
    # what it read becomes a candidate, hashed as JSON: a launch plan with an alias cycle, an alias bomb or a
    # YAML date broke that (a traceback in the run), as a flags block with a NUL broke the compiler's argv
    cand = Candidate(target=target, sources=reply.sources, launch=reply.launch,
                     compile_flags=reply.compile_flags or [])
    assert len(cand.id) == 16 and not any("\x00" in f for f in cand.compile_flags)


@FUZZ
@given(plan=st.one_of(json_values.map(lambda v: json.dumps({"launches": v})),
                      st.sampled_from(["a: &a [*a]", "start: 2001-12-14", "s: !!set {a, b}", "b: !!binary aGk=",
                                       "[" * 3000, "a: &a [x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a]\n"
                                       "c: &c [*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c]\n"
                                       "e: [*d,*d,*d,*d,*d,*d,*d,*d]\n"]), st.text(max_size=40)),
       flags=st.text(max_size=20))
def test_coder_launch_plans_and_flags(plan, flags):
    text = f"```cuda\n__global__ void k() {{}}\n```\n```yaml\n{plan}\n```\n```flags\n{flags}\n```\n"
    test_coder_replies.hypothesis.inner_test(text, "cuda", None)
