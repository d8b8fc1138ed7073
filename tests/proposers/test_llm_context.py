"""What each ``--context`` level puts in the llm proposer's prompts (ksearch.proposers.llm.context and prompts/*.j2).

Snapshot tests: for the selective-scan task on the cpu target, a fixed HardwareSpec built here (never detected)
and a fixed small tree, the planner's initial prompt, the planner's refine prompt and the coder's first prompt
are rendered at every context level (none, hardware, full) and compared with
``tests/proposers/snapshots/<prompt>-<level>.txt`` (system message, then user message). After an intended
change of a template or a view, regenerate them and review the diff:

    KSEARCH_UPDATE_SNAPSHOTS=1 python -m pytest -q tests/proposers/test_llm_context.py
"""

import os
from pathlib import Path

import pytest

from ksearch.errors import ConfigError
from ksearch.records import Candidate, Evaluation, Profile, Status, WorkloadResult
from ksearch.proposers.llm import context as ctx
from ksearch.proposers.llm.proposer import LLMProposer
from ksearch.search.strategy import SearchState, update_state
from ksearch.search.worldmodel import EvalSummary, attach
from tests.proposers.fakes import (NAIVE_MS, TASK, FakeClient, FakeEvidence, edits_json, family, fixed_cpu_spec, fixed_gpu_spec,
                                   root_tree, small_tree)

SNAPSHOTS = Path(__file__).parent / "snapshots"
UPDATE = os.environ.get("KSEARCH_UPDATE_SNAPSHOTS") == "1"


def dump(messages) -> str:
    return "".join(f"===== {m.role} =====\n{m.content}" for m in messages)


ROWS = ("/* the kernel of fam-rows */\n" + "".join(f"static const float c{i} = {i}.0f;\n" for i in range(12))
        + "void run(void) {\n    for (int r = 0; r < rows; r++)\n        scan(r);\n}\n")
POLY = ROWS.replace("scan(r);", "scan_exp2(r);")


def evidence() -> FakeEvidence:
    """The store's answers for the fixed tree: the kernels of fam-rows and exp-poly, and exp-poly's full
    evaluation (intervals, errors against the tolerance, a check workload, the vectorizer's report)."""
    def result(w, ms, purpose_checks=3):
        return WorkloadResult(workload=w, status=Status.PASSED, median_ms=ms, ci_ms=[0.97 * ms, 1.04 * ms],
                              checks=purpose_checks, max_abs_err=1.2e-5, max_rel_err=3.4e-4, tolerance_used=0.031)
    poly = Evaluation(candidate_id="candpoly00000000", task=TASK.name, target="cpu", status=Status.PASSED,
                      workloads=[WorkloadResult(workload="odd", status=Status.PASSED, checks=3, max_abs_err=4e-5,
                                                max_rel_err=1e-3, tolerance_used=0.2),
                                 *[result(k, v / 6) for k, v in NAIVE_MS.items()]],
                      profiles=[Profile(tool="gcc 12.2.0 -fopt-info-vec", metrics={"loops_vectorized": 1,
                                                                                  "loops_not_vectorized": 2},
                                        notes=["kernel.c:3:5: missed: couldn't vectorize loop",
                                               "kernel.c:4:9: optimized: loop vectorized using 32 byte vectors"])])
    return FakeEvidence(candidates={"candrows00000000": Candidate(target="cpu", sources={"kernel.c": ROWS}),
                                    "candpoly00000000": Candidate(target="cpu", sources={"kernel.c": POLY})},
                        evaluations={"candpoly00000000": poly})


def prompts(level: str) -> dict[str, str]:
    """The three prompts at one level, rendered through the proposer with a scripted client."""
    out = {}
    client = FakeClient(edits_json([family("a"), family("b")]), "```c\nvoid run(void) {}\n```")
    p = LLMProposer(TASK, "cpu", fixed_cpu_spec(), planner=client, coder=client, planner_model="p", coder_model="c",
                    context=level, evidence=evidence())
    p.initial_edits(root_tree())
    out["planner-initial"] = dump(client.calls[-1]["messages"])
    rows = "/* the kernel of fam-rows */\nvoid run(void) {}\n"
    p.propose(small_tree(), "exp-poly", Candidate(target="cpu", sources={"kernel.c": rows}))
    out["coder-first"] = dump(client.calls[-1]["messages"])
    tree = attach(small_tree(), "exp-poly", "candpoly00000000",
                  EvalSummary(status="PASSED", score=6.0, latency_ms={k: v / 6 for k, v in NAIVE_MS.items()}))
    state = update_state(SearchState(), tree, "exp-poly", tree["exp-poly"].evaluation)
    client.replies.append(edits_json([{"op": "insert", "parent_id": "exp-poly", "action": {
        "title": "next", "description": "next step"}}]))
    p.refine(tree, "exp-poly", state)
    out["planner-refine"] = dump(client.calls[-1]["messages"])
    return out


@pytest.mark.parametrize("level", ctx.LEVELS)
def test_prompt_snapshots(level):
    for name, text in prompts(level).items():
        path = SNAPSHOTS / f"{name}-{level}.txt"
        if UPDATE:
            path.write_text(text)
            continue
        assert path.is_file(), f"no snapshot {path.name}: run with KSEARCH_UPDATE_SNAPSHOTS=1 and review it"
        assert text == path.read_text(), (f"{path.name} changed: if intended, regenerate with "
                                          "KSEARCH_UPDATE_SNAPSHOTS=1 and review the diff")


def test_what_each_level_adds():
    p = {level: prompts(level) for level in ctx.LEVELS}
    for name in ("planner-initial", "coder-first", "planner-refine"):
        none, hw, full = p["none"][name], p["hardware"][name], p["full"][name]
        for text in (none, hw, full):  # the task, compact, and the node at hand: always
            assert "# Task: selective-scan" in text and "u [batch, dim, seqlen] float32" in text
            assert "rtol 0.0006, atol 0.002" in text and "mamba370m-L4096 (bench)" in text
            assert "def run(u, delta, A, B, C, D, z, delta_bias, h0):" in text and "void run(const float *u" in text
        if name == "coder-first":
            for text in (none, hw, full):
                assert "(the kernel of node fam-rows, correct as it is):" in text
                assert "/* the kernel of fam-rows */" in text
        assert "# Hardware" not in none and "# Hardware: test-cpu" in hw and "# Hardware: test-cpu" in full
        assert "of floor" not in none and "| floor |" not in none  # floors come from the hardware spec
        assert "memory bandwidth: 60 GB/s" in hw and "SIMD: 256-bit, 8 float32 lanes" in hw
        assert "# Knowledge pack" not in hw and "# Knowledge pack: selective-scan-cpu" in full
        assert "# World model" not in hw and "# World model" in full
        if name.startswith("planner"):  # the whole tree with ids at every level; the path only for the coder
            for text in (none, hw, full):
                assert "# The tree" in text and "- root [solved] the naive kernel" in text
                assert "Active path" not in text
        else:
            assert "Active path (root -> current node)" in full and "# The tree" not in full
    for text in (p[level]["planner-refine"] for level in ctx.LEVELS):
        assert "    - exp-poly [solved] exp2-poly: polynomial exp2 (rating 7, confidence 0.4); 6x naive" in text
        assert "-        scan(r);\n+        scan_exp2(r);" in text  # the node's kernel as a diff from its parent's
        assert "6.667 ms (6.467-6.933; 6x naive" in text  # the 99.9% interval of the median
        assert "| odd | check | - | 20% of tolerance (max abs 4e-05, max rel 0.001) |" in text
    assert "void run(const float *u, const float *delta" in p["none"]["planner-initial"].split("===== user")[1]
    assert "loops_vectorized=1" in p["hardware"]["planner-refine"]
    assert "| mamba370m-L512 | 40 ms (6% of floor) | 2.49 ms | 10 ms (4x naive, 25% of floor) |" in \
        p["hardware"]["planner-refine"]
    assert "| mamba370m-L512 | 40 ms | 10 ms (4x naive) | 6.667 ms (6.467-6.933; 6x naive) |" in p["none"]["planner-refine"]
    assert "Frontier (open actions" in p["full"]["planner-refine"]
    assert "Frontier" not in p["full"]["coder-first"]
    assert "alternatives to fam-rows (kernel family):" in p["full"]["coder-first"]
    # tile answers the token-tile decision, exp-poly the exp one: no alternative to it (issue 20)
    assert "alternatives to exp-poly" not in p["full"]["planner-refine"]
    assert "# Action to implement: node exp-poly" in p["none"]["coder-first"]
    assert "# Node just evaluated: exp-poly" in p["none"]["planner-refine"]


def test_check_level():
    assert ctx.check_level("full") == "full"
    with pytest.raises(ConfigError, match="'everything'.*none, hardware, full"):
        ctx.check_level("everything")


def test_abi_per_target():
    d = TASK.definition
    assert ctx.abi(d, "cpu").startswith("void run(const float *u, const float *delta,")
    assert ctx.abi(d, "cpu").endswith("int64_t dstate, int64_t seqlen);")
    assert "const float *u" in ctx.abi(d, "cuda") and "long long seqlen" in ctx.abi(d, "cuda")
    assert ctx.abi(d, "triton") == "run(u, delta, A, B, C, D, z, delta_bias, h0, out, last_state)"


def test_gpu_hardware_view():
    view = ctx.hardware_view(fixed_gpu_spec(), TASK)
    facts = {f["label"]: f["value"] for f in view["facts"]}
    assert facts["SMs"] == "132" and facts["warp width"] == "32 threads"
    assert facts["shared memory per block"] == "227 KiB" and facts["max threads per block"] == "1024"
    assert facts["memory bandwidth"] == "4800 GB/s" and facts["exp rate"] == "2 T exp/s"
    assert facts["peak float16"] == "900 TFLOP/s" and "SIMD" not in facts
    assert [r["name"] for r in view["floors"]] == [w.name for w in TASK.workloads if w.purpose == "bench"]


def test_pack_view_is_compact_and_follows_the_hardware():
    spec = fixed_cpu_spec()
    view = ctx.pack_view(TASK, "cpu", spec)
    assert [f["id"] for f in view["families"]] == ["row-sequential", "channel-vectorized", "chunked-parallel-scan"]
    texts = [f["text"] for f in view["families"]] + [c["text"] for d in view["decisions"] for c in d["choices"]]
    assert all(len(t) <= ctx.PACK_TEXT for t in texts)
    choices = {c["id"] for d in view["decisions"] for c in d["choices"]}
    assert "channel-lanes-avx2" in choices
    assert not any("avx512" in c for c in choices)  # the spec has no AVX-512
    assert ctx.pack_view(TASK, "mlx", spec) is None


def test_tree_view_marks_cooling_actions():
    tree = small_tree()
    tree = attach(tree, "exp-poly", None, EvalSummary(status="COMPILE_ERROR"))
    from ksearch.search.edits import apply
    tree, _ = apply(tree, [{"op": "insert", "parent_id": "fam-rows", "id": "again", "action": {
        "title": "Polynomial  EXP2", "description": "same title"}}])
    state = update_state(SearchState(), tree, "exp-poly", tree["exp-poly"].evaluation)
    view = ctx.tree_view(tree, "exp-poly", state)
    cooling = {n["id"]: n["cooling"] for n in view["frontier"]}
    assert cooling == {"fam-lanes": False, "tile": False, "again": True}
    assert [n["id"] for n in view["path"]] == ["root", "fam-rows", "exp-poly"]
    assert view["path"][2]["result"] == "failed: COMPILE_ERROR"


def test_a_long_frontier_is_cut_to_the_best_rated():
    from ksearch.search.edits import apply
    tree, _ = apply(small_tree(), [{"op": "insert", "parent_id": "fam-rows", "rating": i % 10, "action": {
        "title": f"knob {i}", "description": "tune"}} for i in range(40)])
    view = ctx.tree_view(tree, None)
    # 43 open: the 40 inserted, exp-poly, tile, fam-lanes
    assert len(view["frontier"]) == ctx.FRONTIER_LINES and view["frontier_more"] == 43 - ctx.FRONTIER_LINES
    assert view["frontier"][0]["rating"] == "9"


@pytest.mark.parametrize("target", ["cuda", "triton", "mlx-cuda", "mlx-metal"],
                         ids=["nvrtc", "tl", "mlxc", "mlxm"])  # an id "cuda" would mark it GPU-only
def test_gpu_targets_render_every_prompt(target):
    """Every template renders for the GPU targets at full context (StrictUndefined: nothing missing)."""
    from ksearch.search.edits import apply
    from tests.proposers.fakes import FakeEvidence, failing_evaluation

    code = {"cuda": "```cuda\n__global__ void k() {}\n```\n```yaml\nlaunches: []\n```",
            "triton": "```python\nimport triton\n```",
            "mlx-cuda": "```cuda\nout[0] = 0;\n```\n```yaml\ngrid: [1]\nthreadgroup: [1]\n```",
            "mlx-metal": "```metal\nout[0] = 0;\n```\n```yaml\ngrid: [1]\nthreadgroup: [1]\n```"}[target]
    tree = attach(small_tree(), "exp-poly", "candpoly00000000", EvalSummary(status="INCORRECT_NUMERICAL"))
    state = update_state(SearchState(), tree, "exp-poly", tree["exp-poly"].evaluation)
    evidence = FakeEvidence({"candpoly00000000": Candidate(target=target, sources={"kernel.x": "/* poly */"})},
                            {"candpoly00000000": failing_evaluation("candpoly00000000")})
    retry = {"op": "insert", "parent_id": "fam-rows", "id": "retry", "payload": {"retry_of": "exp-poly"},
             "action": {"title": "fixed poly", "description": "clamp"}}
    client = FakeClient(edits_json([family("a"), family("b")]), edits_json([retry]), edits_json([retry]), code, code,
                        code)
    p = LLMProposer(TASK, target, fixed_gpu_spec(), planner=client, coder=client, planner_model="p", coder_model="c",
                    evidence=evidence)
    p.initial_edits(root_tree())
    p.refine(tree, "exp-poly", state)
    p.expand(tree, state)
    tree, _ = apply(tree, [retry])
    parent = Candidate(target=target, sources={"kernel.x": "/* rows */"})
    made = [p.propose(tree, node, parent) for node in ("retry", "tile", "fam-lanes")]
    assert client.purposes() == ["plan:initial", "plan:failure", "plan:expand", "code:debug", "code:improve",
                                 "code:first"]
    system = client.calls[-1]["messages"][0].content
    assert f"# Target: {target}" in system and "warp width: 32 threads" in system
    assert f"# Knowledge pack: selective-scan-{target}" in system
    if target.startswith("mlx"):
        assert "generated by MLX, not by you" in system and "// ksearch: kernel body" in system
        body = "kernel.cu" if target == "mlx-cuda" else "kernel.metal"
        assert set(made[-1].sources) == {body} and made[-1].launch == {"grid": [1], "threadgroup": [1]}


def system_prompts(target: str, level: str) -> tuple[str, str]:
    """(planner system prompt, coder system prompt) for ``target`` at ``level``, through the proposer."""
    client = FakeClient(edits_json([family("a"), family("b")]), "```python\nimport triton\n```")
    spec = fixed_cpu_spec() if target == "cpu" else fixed_gpu_spec()
    p = LLMProposer(TASK, target, spec, planner=client, coder=client, planner_model="p", coder_model="c",
                    context=level)
    p.initial_edits(root_tree())
    return client.calls[0]["messages"][0].content, p._render("coder_system.j2")


def test_translation_layer_in_prompts_for_a_non_cuda_target():
    """Triton: a concept-map row (CUDA form, Triton form, hard limit) from level hardware on; patterns and
    assertions with their checks at full; nothing of it at none."""
    row = "- cub block scan / warp scan -> tl.associative_scan(x, axis, combine_fn)"
    limit = "[size: CUDA 48 KB static / 227 KB opt-in (H100/H200), triton the same hardware limit"
    assertion = ("- carries-across-chunks: Every chunk starts from the previous chunk's final state. "
                 "(checked by: workload selective-scan/long-seq)")
    pattern = "a_c, b_c = tl.associative_scan((a, b), axis=2, combine_fn=combine)"
    for planner, coder in (system_prompts("triton", "full"),):
        for text in (planner, coder):
            assert "# Translation layer: CUDA to Triton" in text
            assert row in text and limit in text and assertion in text and pattern in text
    for text in system_prompts("triton", "hardware"):
        assert row in text and limit in text
        assert assertion not in text and pattern not in text
    for text in system_prompts("triton", "none"):
        assert "# Translation layer" not in text and row not in text


def test_translation_layer_for_cpu_and_cuda():
    planner, _ = system_prompts("cpu", "full")
    # a CPU kernel has no shared memory or warps to map: no concept rows, but the assertions it must keep
    assert "__shared__ ->" not in planner and "Concept map" not in planner
    assert "- no-foreign-code: The kernel computes itself" in planner
    assert "checked by: rule cpu/replaced-library; rule cpu/shell-out" in planner
    # cuda is the source of every map: no concept map, its own patterns and assertions, ports' ones left out
    view = ctx.translation_view("cuda", "full")
    assert view["concepts"] == [] and view["limits"]
    ids = {a["id"] for a in view["assertions"]}
    assert {"fp32-scan-state", "every-output-written-once", "carries-across-chunks"} <= ids
    assert not ids & {"no-cuda-primitives", "fits-threadgroup-memory", "triton-computes", "no-foreign-code"}
    assert any("__shfl_xor_sync" in "\n".join(p["sketch"]) for p in view["patterns"])


def test_translation_limits_come_from_the_catalog(monkeypatch):
    """The hard limits in the prompt are the hardware catalog's figures (via the static rules' limit table):
    a changed catalog figure changes the prompt."""
    from ksearch.eval import static_checks
    from ksearch.hardware import catalog

    planner, _ = system_prompts("cuda", "hardware")
    h200 = catalog.limits("h200")
    assert f"- static shared bytes: {h200.shared_memory_per_block_bytes} bytes (hardware catalog h200" in planner
    assert f"- max threads per block: {h200.max_threads_per_block} threads (hardware catalog h200" in planner
    real = catalog.limits

    def smaller(name):
        lim = real(name)
        return lim.model_copy(update={"shared_memory_per_block_bytes": 12345}) if lim.name == "h200" else lim

    monkeypatch.setattr(catalog, "limits", smaller)
    static_checks._rule_file.cache_clear()
    try:
        planner, coder = system_prompts("triton", "hardware")
        for text in (planner, coder):
            assert "- static shared bytes: 12345 bytes (hardware catalog h200 (shared_memory_per_block_bytes)" in text
    finally:
        monkeypatch.undo()
        static_checks._rule_file.cache_clear()


@pytest.mark.parametrize("target", ["cpu", "cuda", "triton", "mlx-metal"])
def test_translation_section_stays_within_its_budget(target):
    view = ctx.translation_view(target, "full")
    assert view is not None and ctx.translation_size(view) <= ctx.TRANSLATION_CHARS
    text = ctx.render("_translation.j2", translation=view, target=target)
    assert len(text) < ctx.TRANSLATION_CHARS * 1.2
    assert view["assertions"], "assertions are never dropped for length"


def test_a_node_whose_kernel_is_in_flight_reads_being_judged_in_every_tree_view():
    from ksearch.proposers.llm.context import compact_tree, node_line
    from ksearch.search.edits import Insert, apply
    from ksearch.search.worldmodel import ROOT_ID, Action, EvalSummary, Tree, attach

    tree = attach(Tree.new(), ROOT_ID, "naive", EvalSummary(status="PASSED", score=1.0))
    tree, _ = apply(tree, [Insert(parent_id=ROOT_ID, id="a", action=Action(title="a")),
                           Insert(parent_id=ROOT_ID, id="b", action=Action(title="b"))])
    tree = tree.replace(in_flight={"a": "k1"})
    lines = {ln["id"]: ln["status"] for ln in compact_tree(tree)["lines"]}
    assert lines["a"] == "being judged" and lines["b"] == "open"
    assert node_line(tree, tree["a"])["status"] == "being judged"
