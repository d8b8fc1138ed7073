"""The llm proposer with a scripted fake client: the planner's edit protocol (validation, errors sent back,
continuation), the coder's prompt selection (first / debug / improve) and kernel extraction, and one run of the
controller on a fake judge."""

import json
import re

import pytest

from ksearch.errors import ConfigError, KnowledgeError, LLMBudgetExhausted, LLMUnavailable
from ksearch.records import Candidate, Evaluation, Status, WorkloadResult
from ksearch.llm.base import LLMReply
from ksearch.proposers.llm.proposer import LLMProposer
from ksearch.search.edits import Insert, Update, apply
from ksearch.search.strategy import SearchState, update_state
from ksearch.search.worldmodel import ROOT_ID, EvalSummary, NodeStatus, Tree, attach
from tests.proposers.fakes import (NAIVE_MS, TASK, FakeClient, FakeEvidence, edits_json, failing_evaluation, family,
                                   fixed_cpu_spec, root_tree, small_tree)

KERNEL = "#include <stdint.h>\nvoid run(void) { /* 0x1.8p+1f */ }\n"


def make(*replies, context="full", coder=None, **kw):
    planner = FakeClient(*replies)
    p = LLMProposer(TASK, "cpu", fixed_cpu_spec(), planner=planner, coder=coder or planner, planner_model="plan-m",
                    coder_model="code-m", context=context, **kw)
    return p, planner


def applied(tree, edits):
    new, results = apply(tree, edits)
    assert all(r.ok for r in results), [r.reason for r in results if not r.ok]
    return new


def failed_tree(evidence_cid="candpoly00000000"):
    """small_tree with exp-poly tried and failed (INCORRECT_NUMERICAL)."""
    tree = attach(small_tree(), "exp-poly", evidence_cid, EvalSummary(status="INCORRECT_NUMERICAL"))
    state = update_state(SearchState(), tree, "exp-poly", tree["exp-poly"].evaluation)
    return tree, state


# -- the planner: the first tree ---------------------------------------------------------------------------


def test_initial_tree_from_valid_edits():
    analysis = {"op": "update", "node_id": ROOT_ID,
                "fields": {"payload": {"analysis": {"classification": "linear recurrence",
                                                    "regimes": ["a", "b", "c"]}}}}
    reply = edits_json([analysis, family("rows"), family("lanes"),
                        {**family("rows-exp"), "parent_id": "rows", "decision": "exp"}],
                       prose="The scan is exp-bound.\n")
    p, client = make(reply)
    tree = root_tree()
    edits = p.initial_edits(tree)
    assert [type(e) for e in edits] == [Update, Insert, Insert, Insert]
    new = applied(tree, edits)
    assert [n.id for n in new.children(ROOT_ID)] == ["rows", "lanes"]
    assert new.root.payload["analysis"]["classification"] == "linear recurrence"
    call = client.calls[0]
    assert (call["role"], call["purpose"], call["model"]) == ("planner", "plan:initial", "plan-m")
    assert call["node_id"] is None
    assert [m.role for m in call["messages"]] == ["system", "user"]
    assert len(client.calls) == 1


def test_invalid_edits_are_sent_back_with_the_errors_and_the_correction_applied():
    bad = [family("rows"), {**family("x"), "parent_id": "nowhere"}, family("lanes", rating=42)]
    good = [family("rows"), family("lanes")]
    p, client = make(edits_json(bad), edits_json(good))
    tree = root_tree()
    edits = p.initial_edits(tree)
    assert [e.id for e in edits] == ["rows", "lanes"]
    assert len(client.calls) == 2
    msgs = client.calls[1]["messages"]
    assert [m.role for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[2].content == edits_json(bad)  # the planner's own reply, as it was
    fix = msgs[3].content
    assert "2 of your edits were rejected (1 would have applied)" in fix
    assert "edit 1 (insert): unknown node id 'nowhere'" in fix
    assert re.search(r"edit 2 \(insert\): malformed edit: insert.rating: .*less than or equal to 10", fix)
    assert "complete corrected JSON array" in fix
    assert client.purposes() == ["plan:initial", "plan:initial"]


def test_garbage_twice_then_valid():
    p, client = make("Let me think about this.", '```json\n[{"op": "insert", "parent_id": "root", ',
                     edits_json([family("a"), family("b")]))
    edits = p.initial_edits(root_tree())
    assert [e.id for e in edits] == ["a", "b"]
    assert len(client.calls) == 3
    assert "could not be read" in client.calls[1]["messages"][-1].content
    assert "no JSON array" in client.calls[1]["messages"][-1].content
    assert "not valid JSON" in client.calls[2]["messages"][-1].content
    assert len(client.calls[2]["messages"]) == 6


def test_a_reply_that_never_validates_gives_no_edits_and_no_crash():
    p, client = make(*["no idea"] * 4)
    tree = root_tree()
    assert p.initial_edits(tree) == []
    assert len(client.calls) == 4  # the question and max_fix_rounds=3 corrections


def test_rejected_edits_change_nothing_and_only_valid_ones_are_returned():
    reply = edits_json([family("a"), {"op": "delete", "node_id": ROOT_ID}, family("b"),
                        {"op": "update", "node_id": ROOT_ID, "fields": {"status": "open"}}])
    p, client = make(reply, max_fix_rounds=0)
    tree = root_tree()
    edits = p.initial_edits(tree)
    assert [e.id for e in edits] == ["a", "b"]
    new = applied(tree, edits)
    assert new.root == tree.root and len(new) == 3
    assert len(client.calls) == 1


def test_initial_with_one_family_asks_once_more():
    p, client = make(edits_json([family("a")]), edits_json([family("a"), family("b")]))
    edits = p.initial_edits(root_tree())
    assert [e.id for e in edits] == ["a", "b"]
    assert "1 open kernel family under 'root'" in client.calls[1]["messages"][-1].content
    assert "Your edits are valid" in client.calls[1]["messages"][-1].content


def test_edit_checks_of_the_proposer():
    tree = root_tree()
    no_desc = family("a", action={"title": "x", "description": " "})
    big = family("b", payload={"blob": "x" * 2000})
    bad_retry = family("c", payload={"retry_of": "root"})
    p, client = make(edits_json([no_desc, big, bad_retry, family("d"), family("e")]), max_fix_rounds=0)
    assert [e.id for e in p.initial_edits(tree)] == ["d", "e"]
    p, client = make(edits_json([no_desc, big, bad_retry]), edits_json([family("d"), family("e")]))
    p.initial_edits(tree)
    fix = client.calls[1]["messages"][-1].content
    assert "edit 0 (insert): the action 'x' needs a description" in fix
    assert "edit 1 (insert): payload is" in fix and "keep it under 1200" in fix
    assert "edit 2 (insert): retry_of must name a failed node (got 'root')" in fix


def test_planner_errors_propagate():
    p, _ = make(LLMBudgetExhausted("max cost reached"))
    with pytest.raises(LLMBudgetExhausted):
        p.initial_edits(root_tree())
    p, _ = make("garbage", LLMUnavailable("endpoint down"))
    with pytest.raises(LLMUnavailable):
        p.initial_edits(root_tree())


def test_the_system_prompt_example_is_a_valid_batch():
    p, client = make(edits_json([family("a"), family("b")]))
    p.initial_edits(root_tree())
    system = client.calls[0]["messages"][0].content
    example = re.search(r"Example:\n```json\n(.*?)\n```", system, re.S).group(1)
    applied(root_tree(), json.loads(example))


def test_bad_context_level_and_target():
    with pytest.raises(ConfigError, match="'most'"):
        make(context="most")
    with pytest.raises(ConfigError, match="not 'mlx'"):
        LLMProposer(TASK, "mlx", None, planner=None, coder=None, planner_model="m", coder_model="m")


# -- the planner: refining after a result -----------------------------------------------------------------


def test_refine_after_a_solved_node():
    tree = small_tree()
    state = update_state(SearchState(), tree, "fam-rows", tree["fam-rows"].evaluation)
    child = {"op": "insert", "parent_id": "fam-rows", "id": "lanes-on-rows", "decision": "simd", "choice": "lanes",
             "action": {"title": "vectorize the state loop", "description": "AVX2 over dstate"}}
    upd = {"op": "update", "node_id": "fam-rows",
           "fields": {"rating": 8, "confidence": 0.8, "impacts": {"notes": "faster than predicted: 4x, not 3x"}}}
    p, client = make(edits_json([upd, child]))
    edits = p.refine(tree, "fam-rows", state)
    new = applied(tree, edits)
    assert new["fam-rows"].rating == 8 and new["fam-rows"].impacts.notes.startswith("faster")
    assert new["lanes-on-rows"].status == NodeStatus.OPEN
    call = client.calls[0]
    assert (call["purpose"], call["node_id"]) == ("plan:refine", "fam-rows")
    user = call["messages"][-1].content
    assert "# Node just evaluated: fam-rows" in user
    assert "predicted 3x over the parent, measured 4x: better than predicted by 1.333x" in user
    assert "| mamba370m-L512 | 40 ms" in user and "10 ms (4x naive" in user
    # the planner left the open siblings' ratings alone: revise moves them toward the evidence
    revised = [e for e in edits if isinstance(e, Update) and e.node_id != "fam-rows"]
    assert revised and all(set(e.fields) == {"rating", "confidence"} for e in revised)


def test_a_node_the_planner_edits_in_any_field_keeps_its_rating_from_revise():
    """issue 20: an update of impacts alone (or a choose) is the planner's judgement of that node: `revise` does not
    move its rating and confidence behind the planner's back; nodes it left alone are still revised."""
    tree = small_tree()
    state = update_state(SearchState(), tree, "fam-rows", tree["fam-rows"].evaluation)
    child = {"op": "insert", "parent_id": "fam-rows", "id": "next", "action": {"title": "next", "description": "x"}}
    notes = {"op": "update", "node_id": "fam-lanes", "fields": {"impacts": {"notes": "still the best bet"}}}
    p, _ = make(edits_json([child, notes, {"op": "choose", "node_id": "fam-lanes"}]))
    edits = p.refine(tree, "fam-rows", state)
    revised = {e.node_id for e in edits if isinstance(e, Update) and set(e.fields) == {"rating", "confidence"}}
    assert "fam-lanes" not in revised and "fam-rows" in revised
    new = applied(tree, edits)
    assert new["fam-lanes"].rating == tree["fam-lanes"].rating and new.chosen == "fam-lanes"


def test_the_prompts_list_only_the_runs_workloads():
    """issue 20: a run on some workloads is told about those, not the task's others (their floors included)."""
    from tests.proposers.fakes import fixed_cpu_spec
    client = FakeClient(edits_json([family("a"), family("b")]))
    p = LLMProposer(TASK, "cpu", fixed_cpu_spec(), planner=client, coder=client, planner_model="p",
                    coder_model="c", workloads=["mamba370m-L512", "tiny"])
    root = attach(Tree.new(), ROOT_ID, "naive0000000000",
                  EvalSummary(status="PASSED", score=1.0, latency_ms={"mamba370m-L512": 40.0}))
    p.initial_edits(root)
    text = "".join(m.content for m in client.calls[0]["messages"])
    assert "mamba370m-L512" in text and "mamba370m-L4096" not in text and "mamba370m-L2048" not in text


def test_refine_without_a_continuation_asks_once_then_lets_expand_handle_it():
    tree = small_tree()
    tree = attach(tree, "tile", "candtile00000000",
                  EvalSummary(status="PASSED", score=4.4, latency_ms={k: v / 4.4 for k, v in NAIVE_MS.items()}))
    state = update_state(SearchState(), tree, "tile", tree["tile"].evaluation)
    only_rating = edits_json([{"op": "update", "node_id": "tile", "fields": {"rating": 6, "confidence": 0.9}}])
    p, client = make(only_rating, only_rating)
    edits = p.refine(tree, "tile", state)
    assert len(client.calls) == 2
    assert "has no open child; insert at least one open child under 'tile'" in client.calls[1]["messages"][-1].content
    assert not any(isinstance(e, Insert) for e in edits)  # nothing invented in the planner's place
    assert edits[0] == Update(node_id="tile", fields={"rating": 6, "confidence": 0.9})


def test_refine_after_a_failure_uses_the_failure_prompt_with_the_evidence():
    tree, state = failed_tree()
    ev = FakeEvidence({"candpoly00000000": Candidate(target="cpu", sources={"kernel.c": "/* poly */"})},
                      {"candpoly00000000": failing_evaluation("candpoly00000000")})
    retry = {"op": "insert", "parent_id": "fam-rows", "id": "exp-poly-clamped", "decision": "exp", "choice": "poly",
             "action": {"title": "polynomial exp2 with range reduction", "description": "as exp-poly, clamp x"},
             "payload": {"retry_of": "exp-poly"}}
    down = {"op": "update", "node_id": "exp-poly", "fields": {"rating": 3, "confidence": 0.7}}
    p, client = make(edits_json([down, retry]), evidence=ev)
    edits = p.refine(tree, "exp-poly", state)
    new = applied(tree, edits)
    assert new["exp-poly-clamped"].payload == {"retry_of": "exp-poly"}
    assert new["exp-poly"].rating == 3
    call = client.calls[0]
    assert call["purpose"] == "plan:failure" and call["node_id"] == "exp-poly"
    user = call["messages"][-1].content
    assert "What happened: INCORRECT_NUMERICAL\n<<<UNTRUSTED " in user
    assert ": the judge's message, which can quote the kernel's stderr and errors>>>\n| odd: out beyond tolerance\n" in user
    assert "Failing workload: odd (batch=1 dim=37 dstate=5 seqlen=333)" in user
    assert "max abs error 0.37, max rel error 0.021 (tolerance float32: rtol 0.0006, atol 0.002)" in user
    assert '`{"retry_of": "exp-poly"}`' in user and "downscore" in user and "delete" in user


def test_plan_failure_gets_this_steps_evaluation_before_the_store_has_it():
    """The controller writes a step after its refinement: the failure prompt learns why the node failed from the
    evaluation handed to refine, not from the store (issue 20: 'the evaluation's messages are not available')."""
    tree, state = failed_tree()
    down = {"op": "update", "node_id": "exp-poly", "fields": {"rating": 3, "confidence": 0.7}}
    keep = {"op": "insert", "parent_id": "fam-rows", "decision": "exp", "choice": "exp2f",
            "action": {"title": "exp2f", "description": "libm exp2f"}}
    p, client = make(edits_json([down, keep]), evidence=FakeEvidence({}, {}))  # the store knows nothing yet
    p.refine(tree, "exp-poly", state, failing_evaluation("candpoly00000000"))
    user = client.calls[0]["messages"][-1].content
    assert client.calls[0]["purpose"] == "plan:failure" and "not available to this proposer" not in user
    assert "| odd: out beyond tolerance\n" in user and "max abs error 0.37, max rel error 0.021" in user
    p2, client2 = make(edits_json([down, keep]), evidence=FakeEvidence({}, {}))
    p2.refine(tree, "exp-poly", state)  # without it (a resumed run reads the store): said so, as before
    assert "not available to this proposer" in client2.calls[0]["messages"][-1].content


def test_failure_without_a_retry_needs_a_triable_action():
    tree, state = failed_tree()
    tree = applied(tree, [{"op": "delete", "node_id": "tile"}, {"op": "delete", "node_id": "fam-lanes"}])
    p, client = make(edits_json([{"op": "update", "node_id": "exp-poly", "fields": {"rating": 1}}]),
                     edits_json([{"op": "update", "node_id": "exp-poly", "fields": {"rating": 1}},
                                 {"op": "insert", "parent_id": "fam-rows", "decision": "exp", "choice": "exp2f",
                                  "action": {"title": "libm exp2f", "description": "exp2f with log2 e folded in A"}}]))
    edits = p.refine(tree, "exp-poly", state)
    assert any(isinstance(e, Insert) for e in edits)
    assert "no open action can be tried next" in client.calls[1]["messages"][-1].content


def test_expand():
    tree, state = failed_tree()
    tree = applied(tree, [{"op": "delete", "node_id": "tile"}, {"op": "delete", "node_id": "fam-lanes"}])
    new_action = {"op": "insert", "parent_id": "fam-rows", "decision": "gating", "choice": "fused",
                  "action": {"title": "fuse the gate", "description": "silu(z) in the scan loop"}}
    p, client = make(edits_json([new_action]))
    edits = p.expand(tree, state)
    assert len(edits) == 1 and client.calls[0]["purpose"] == "plan:expand"
    user = client.last_user()
    assert "No open action can be tried now" in user and "fam-rows [solved]" in user
    p, client = make("Nothing left worth trying.\n```json\n[]\n```")
    assert p.expand(tree, state) == [] and len(client.calls) == 1  # an explicit [] ends the run


# -- the coder ----------------------------------------------------------------------------------------------


def code_reply(body=KERNEL, lang="c", **kw):
    return LLMReply(text=f"Plan: vectorize.\n```{lang}\n{body}```\nDone.", model="code-m", **kw)


def test_the_coder_sets_compile_flags_with_a_flags_block_and_keeps_the_parents_without_one():
    """Issue 20: the pack offers -ffast-math, so the coder can ask for flags (a ```flags block); they replace the
    starting kernel's, which it is shown; a reply without one keeps them."""
    tree = small_tree()
    with_flags = LLMReply(text=f"```c\n{KERNEL}```\n```flags\n-O3  -ffast-math\n-march=native\n```\n", model="code-m")
    coder = FakeClient(with_flags, code_reply())
    p, _ = make(coder=coder)
    assert "add one ```flags block" in coder_system(p)
    first = p.propose(tree, "fam-lanes", None)
    assert first.compile_flags == ["-O3", "-ffast-math", "-march=native"]
    second = p.propose(tree, "fam-lanes", first)
    assert second.compile_flags == first.compile_flags  # no block: the parent's flags kept
    assert "compile flags:\n```flags\n-O3 -ffast-math -march=native\n```" in coder.last_user()


def test_a_flags_block_for_a_target_that_takes_none_is_noted_and_ignored():
    from ksearch.proposers.llm.parse import extract_code

    code = extract_code("```python\ndef run(u, y): pass\n```\n```flags\n-O3\n```\n", "null")
    assert code.compile_flags is None and any("take no compile flags" in n for n in code.notes)
    assert extract_code("```c\nvoid run(void) {}\n```\n", "cpu").compile_flags is None


def coder_system(p) -> str:
    return p._render("coder_system.j2")


def test_code_first_from_the_naive_kernel():
    tree = small_tree()
    coder = FakeClient(code_reply())
    p, _ = make(coder=coder)
    cand = p.propose(tree, "fam-lanes", None)
    assert cand.sources == {"kernel.c": KERNEL} and cand.target == "cpu"  # exactly as written
    assert cand.meta["mode"] == "first"
    call = coder.calls[0]
    assert (call["role"], call["purpose"], call["model"], call["node_id"]) == ("coder", "code:first", "code-m",
                                                                               "fam-lanes")
    user = call["messages"][-1].content
    assert "# Action to implement: node fam-lanes" in user
    assert "channels in SIMD lanes: 8 channels per AVX2 vector" in user
    assert "the naive kernel, correct as it is" in user
    assert TASK.naive_sources["cpu"].rstrip("\n") in user


def test_code_first_from_the_parent_kernel():
    tree = small_tree()
    coder = FakeClient(code_reply())
    p, _ = make(coder=coder)
    parent = Candidate(target="cpu", sources={"kernel.c": "/* the rows kernel */\n"})
    p.propose(tree, "exp-poly", parent)
    user = coder.last_user()
    assert "the kernel of node fam-rows" in user and "/* the rows kernel */" in user
    assert TASK.naive_sources["cpu"][:40] not in user


def test_code_debug_for_a_retry_with_the_failure_details():
    tree, _ = failed_tree()
    ev = failing_evaluation("candpoly00000000").model_copy(update={
        "status": Status.COMPILE_ERROR, "message": "compile failed",
        "compile_log": "kernel.c:3:5: error: 'h' undeclared\n" + "x" * 5000, "workloads": []})
    evidence = FakeEvidence({"candpoly00000000": Candidate(target="cpu", sources={"kernel.c": "/* poly, broken */\n"})},
                            {"candpoly00000000": ev})
    tree = applied(tree, [{"op": "insert", "parent_id": "fam-rows", "id": "retry", "decision": "exp", "choice": "poly",
                           "action": {"title": "poly exp2, declared state", "description": "fix the build"},
                           "payload": {"retry_of": "exp-poly"}}])
    coder = FakeClient(code_reply())
    p, _ = make(coder=coder, evidence=evidence)
    cand = p.propose(tree, "retry", Candidate(target="cpu", sources={"kernel.c": "/* rows */"}))
    assert cand.meta["mode"] == "debug" and coder.calls[0]["purpose"] == "code:debug"
    user = coder.last_user()
    assert "The last attempt (exp-poly) failed: COMPILE_ERROR\n<<<UNTRUSTED " in user and "| compile failed\n" in user
    assert ": compiler output>>>\n| kernel.c:3:5: error: 'h' undeclared\n" in user
    assert "| [... 1,043 of 5,036 characters not shown ...]\n" in user
    assert "/* poly, broken */" in user


def test_code_debug_with_numerical_error_size():
    tree, _ = failed_tree()
    evidence = FakeEvidence({"candpoly00000000": Candidate(target="cpu", sources={"kernel.c": "/* poly */\n"})},
                            {"candpoly00000000": failing_evaluation("candpoly00000000")})
    coder = FakeClient(code_reply())
    p, _ = make(coder=coder, evidence=evidence)
    p.propose(tree, "exp-poly", None)  # the node itself failed: a later attempt at it debugs its kernel
    user = coder.last_user()
    assert coder.calls[0]["purpose"] == "code:debug"
    assert "odd (batch=1 dim=37 dstate=5 seqlen=333): INCORRECT_NUMERICAL; max abs error" in user
    assert "can quote the kernel's errors>>>\n| out: 17 of 12321 elements beyond tolerance\n" in user
    assert "max abs error 0.37, max rel error 0.021" in user


def test_code_debug_uses_the_kernels_this_proposer_wrote():
    tree = small_tree()
    coder = FakeClient(code_reply("/* mine */\n"), code_reply())
    p, _ = make(coder=coder)  # no evidence store: the failed kernel is remembered, its messages are not
    cand = p.propose(tree, "exp-poly", None)
    tree = attach(tree, "exp-poly", cand.id, EvalSummary(status="RUNTIME_ERROR"))
    tree = applied(tree, [{"op": "insert", "parent_id": "fam-rows", "id": "retry", "action": {
        "title": "poly exp2, again", "description": "fix"}, "payload": {"retry_of": "exp-poly"}}])
    p.propose(tree, "retry", None)
    user = coder.last_user()
    assert coder.calls[1]["purpose"] == "code:debug"
    assert "/* mine */" in user and "RUNTIME_ERROR" in user and "not available to this proposer" in user


def test_a_retry_of_an_attempt_that_left_no_kernel_starts_from_the_parent():
    tree = small_tree()
    coder = FakeClient(LLMReply(text="```c\nvoid run(", finish_reason="length"), code_reply())
    p, _ = make(coder=coder)
    with pytest.raises(KnowledgeError, match="truncated"):
        p.propose(tree, "exp-poly", None)
    tree = attach(tree, "exp-poly", None, EvalSummary(status="COMPILE_ERROR"))
    tree = applied(tree, [{"op": "insert", "parent_id": "fam-rows", "id": "retry", "action": {
        "title": "shorter poly exp2", "description": "fewer lines"}, "payload": {"retry_of": "exp-poly"}}])
    cand = p.propose(tree, "retry", Candidate(target="cpu", sources={"kernel.c": "/* rows */\n"}))
    assert cand.meta["mode"] == "first" and coder.calls[1]["purpose"] == "code:first"
    user = coder.last_user()
    assert "A previous attempt at this step (exp-poly) failed: COMPILE_ERROR\n<<<UNTRUSTED " in user
    assert ": why the coder's reply held no kernel>>>\n| truncated reply" in user
    assert "/* rows */" in user


def test_code_improve_shows_times_and_floor_of_parent_and_best():
    tree = small_tree()
    tree = attach(tree, "fam-lanes", "candlanes0000000",
                  EvalSummary(status="PASSED", score=8.0, latency_ms={k: v / 8 for k, v in NAIVE_MS.items()}))
    coder = FakeClient(code_reply())
    p, _ = make(coder=coder)
    p.propose(tree, "tile", Candidate(target="cpu", sources={"kernel.c": "/* rows */\n"}))
    assert coder.calls[0]["purpose"] == "code:improve"
    user = coder.last_user()
    assert "| workload | naive | floor | parent fam-rows | best so far fam-lanes |" in user
    assert re.search(r"\| mamba370m-L512 \| 40 ms \(\d+% of floor\) \| [\d.]+ ms \| 10 ms \(4x naive, \d+% of floor\) "
                     r"\| 5 ms \(8x naive, \d+% of floor\) \|", user)
    assert "/* rows */" in user and "without changing its approach" in user


def test_code_improve_shows_the_error_of_a_failed_improvement_of_the_same_kernel():
    """Without a planner (evolve, random) a failed child is never drawn as a parent: its error reaches the coder
    through the next improvement of the same kernel, or never."""
    tree = small_tree()
    coder = FakeClient(code_reply(), code_reply())
    p, _ = make(coder=coder)
    p.propose(tree, "tile", Candidate(target="cpu", sources={"kernel.c": "/* rows */\n"}))
    assert "failed" not in coder.last_user().split("The kernel to improve")[0].lower()
    broken = Candidate(target="cpu", sources={"kernel.c": "/* broken sibling */\n"})
    p._made[broken.id] = broken
    tree = attach(tree, "exp-poly", broken.id, EvalSummary(status="COMPILE_ERROR"))
    p.propose(tree, "tile", Candidate(target="cpu", sources={"kernel.c": "/* rows */\n"}))
    user = coder.last_user()
    assert coder.calls[1]["purpose"] == "code:improve"
    assert "An earlier attempt to improve this kernel (exp-poly) failed: COMPILE_ERROR" in user
    assert user.index("(exp-poly) failed") < user.index("The kernel to improve") < user.index("/* rows */")


def test_truncated_or_missing_code_raises_knowledge_error():
    tree = small_tree()
    p, _ = make(coder=FakeClient(LLMReply(text="```c\nvoid run() {\n", finish_reason="max_tokens")))
    with pytest.raises(KnowledgeError, match="truncated reply.*token limit"):
        p.propose(tree, "fam-lanes", None)
    p, _ = make(coder=FakeClient("I would vectorize the channels."))
    with pytest.raises(KnowledgeError, match="no ```c block"):
        p.propose(tree, "fam-lanes", None)


def test_coder_errors_propagate():
    p, _ = make(coder=FakeClient(LLMUnavailable("down")))
    with pytest.raises(LLMUnavailable):
        p.propose(small_tree(), "fam-lanes", None)


def test_cuda_candidate_carries_the_launch_plan():
    text = ("```cuda\nextern \"C\" __global__ void k() {}\n```\n```yaml\nlaunches:\n  - kernel: k\n"
            "    grid: [\"batch*dim\"]\n    block: [32]\n```")
    coder = FakeClient(text)
    p = LLMProposer(TASK, "cuda", None, planner=coder, coder=coder, planner_model="m", coder_model="m", context="none")
    cand = p.propose(small_tree(), "fam-lanes", None)
    assert cand.target == "cuda" and set(cand.sources) == {"kernel.cu"}
    assert cand.launch["launches"][0]["grid"] == ["batch*dim"]
    user = coder.last_user()
    assert "kernel.cu:\n```cuda\n" in user and "launch plan:\n```yaml\n" in user  # the naive kernel and its plan


# -- the controller with the llm proposer -------------------------------------------------------------------


class FakeJudge:
    """Passes every kernel; the time comes from a number in the source (``/* speed 3 */`` = 3x naive)."""

    def __init__(self):
        self.task = TASK

    def naive_candidate(self):
        return Candidate(target="cpu", sources={"kernel.c": TASK.naive_sources["cpu"]})

    def remember_naive(self, ev):
        pass

    def evaluate(self, candidate, workloads=None, timing=True, with_speedup=True, references=()):
        m = re.search(r"speed (\d+)", candidate.sources.get("kernel.c", ""))
        speed = float(m.group(1)) if m else 1.0
        res = [WorkloadResult(workload=w, status=Status.PASSED, median_ms=ms / speed,
                              speedup_vs_naive=speed if with_speedup else None) for w, ms in NAIVE_MS.items()]
        return Evaluation(candidate_id=candidate.id, task=TASK.name, target="cpu", status=Status.PASSED, workloads=res)


def test_controller_runs_with_the_llm_proposer(tmp_path):
    from ksearch.run.controller import Controller, RunConfig
    from ksearch.store.db import Store

    store = Store(tmp_path / "run.sqlite", create=True)
    store.create_run("r", TASK.name, "cpu", {}, {}, None)
    planner = FakeClient(
        edits_json([family("a", rating=9), family("b", rating=2)]),                               # plan:initial
        edits_json([{"op": "insert", "parent_id": "a", "id": "a1", "action": {"title": "step", "description": "go"}}]),
        edits_json([{"op": "update", "node_id": "b", "fields": {"rating": 1}}]),                 # plan:failure
    )
    coder = FakeClient("```c\n/* speed 3 */\n```", LLMReply(text="```c\n/* speed", finish_reason="length"))
    p = LLMProposer(TASK, "cpu", fixed_cpu_spec(), planner=planner, coder=coder, planner_model="p", coder_model="c",
                    evidence=store)
    c = Controller(store, TASK, FakeJudge(), p, RunConfig(task=TASK.name, budget=5))
    c.start()
    assert [n.id for n in c.tree.children(ROOT_ID)] == ["a", "b"]
    first = c.step()
    assert first.node_id == "a" and first.node_status == "solved" and c.tree["a1"].status == NodeStatus.OPEN
    second = c.step()  # a1: the coder's reply is cut: the node fails with the message, the run goes on
    assert second.node_id == "a1" and second.node_status == "failed"
    assert "proposer could not write a kernel: truncated reply" in second.evaluation.message
    assert planner.purposes() == ["plan:initial", "plan:refine", "plan:failure"]
    assert coder.purposes() == ["code:first", "code:first"]
    assert c.evaluations == 1


# -- the cacheable prefix -------------------------------------------------------------------------------------


@pytest.mark.parametrize("context", ["none", "hardware", "full"])
def test_the_system_prompts_are_byte_identical_across_a_runs_calls(context):
    """issue 20: providers cache a prompt's prefix (Anthropic's cache_control on the system block, OpenAI's
    automatic prefix cache), so the planner's system message must be the same bytes on every planner call of a run
    and the coder's on every coder call, whatever the tree, the node or the prompt; a resumed run (a new proposer
    with the same settings) sends the same bytes too."""
    planner = FakeClient(
        edits_json([family("a")]), edits_json([family("a"), family("b")]),                # plan:initial, asked again
        "no array here", edits_json([{"op": "insert", "parent_id": "fam-rows", "id": "n1",  # plan:refine, a fix round
                                      "action": {"title": "next", "description": "go"}}]),
        edits_json([{"op": "update", "node_id": "exp-poly", "fields": {"rating": 2}},     # plan:failure
                    {"op": "insert", "parent_id": "fam-rows", "action": {"title": "exp2f", "description": "libm"}}]),
        edits_json([{"op": "insert", "parent_id": "fam-rows", "action": {"title": "fuse", "description": "x"}}]),
    )
    coder = FakeClient(*[code_reply()] * 3)
    evidence = FakeEvidence({"candpoly00000000": Candidate(target="cpu", sources={"kernel.c": "/* poly */"})},
                            {"candpoly00000000": failing_evaluation("candpoly00000000")})
    p = LLMProposer(TASK, "cpu", fixed_cpu_spec(), planner=planner, coder=coder, planner_model="p", coder_model="c",
                    context=context, evidence=evidence)
    p.initial_edits(root_tree())
    tree = small_tree()
    p.refine(tree, "fam-rows", update_state(SearchState(), tree, "fam-rows", tree["fam-rows"].evaluation))
    failed, state = failed_tree()
    p.refine(failed, "exp-poly", state)
    p.expand(failed, state)
    p.propose(tree, "fam-lanes", None)                                                    # code:first
    p.propose(tree, "tile", Candidate(target="cpu", sources={"kernel.c": "/* rows */\n"}))  # code:improve
    retry = applied(failed, [{"op": "insert", "parent_id": "fam-rows", "id": "r", "payload": {"retry_of": "exp-poly"},
                              "action": {"title": "retry", "description": "clamp"}}])
    p.propose(retry, "r", Candidate(target="cpu", sources={"kernel.c": "/* rows */\n"}))  # code:debug
    assert planner.purposes() == ["plan:initial"] * 2 + ["plan:refine"] * 2 + ["plan:failure", "plan:expand"]
    assert coder.purposes() == ["code:first", "code:improve", "code:debug"]

    def systems(client):
        heads = [c["messages"][0] for c in client.calls]
        assert all(m.role == "system" for m in heads)
        assert all(m.role != "system" for c in client.calls for m in c["messages"][1:])  # the prefix is one block
        return {m.content.encode() for m in heads}

    plan_sys, code_sys = systems(planner), systems(coder)
    assert len(plan_sys) == 1 and len(code_sys) == 1 and plan_sys != code_sys
    again = FakeClient(edits_json([family("a"), family("b")]), code_reply())
    q = LLMProposer(TASK, "cpu", fixed_cpu_spec(), planner=again, coder=again, planner_model="p", coder_model="c",
                    context=context, evidence=evidence)
    q.initial_edits(root_tree())
    q.propose(tree, "fam-lanes", None)
    assert [c["messages"][0].content.encode() for c in again.calls] == [*plan_sys, *code_sys]
