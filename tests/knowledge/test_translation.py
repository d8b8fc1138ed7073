"""The translation layer as data: every map loads, every concept row has an equivalent, a note and a source,
every check names an existing static rule or workload, and `ksearch knowledge show` prints them."""

import json

import pytest
from typer.testing import CliRunner

from ksearch.cli import app
from ksearch.errors import KnowledgeError
from ksearch.knowledge.translation import (
    Check,
    as_dict,
    available,
    load_translation,
    load_translation_file,
    unresolved_checks,
)

PAIRS = [("cuda", "metal"), ("cuda", "cpu"), ("cuda", "triton")]


def test_the_three_maps_ship():
    assert set(PAIRS) <= set(available())


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: "-".join(p))
def test_every_row_validates_and_has_a_source(pair):
    m = load_translation(*pair)
    assert (m.source, m.target) == pair
    assert len(m.concepts) >= 10 and len(m.patterns) >= 4 and len(m.assertions) >= 4
    for c in m.concepts:
        assert c.equivalent and c.note and c.source in m.sources
        assert all(lim.source in m.sources and lim.cuda and lim.target for lim in c.limits)
    for p in m.patterns:
        assert p.sketches[m.source].strip() and p.sketches[m.target].strip()
    assert all(v.strip() for v in m.sources.values())


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: "-".join(p))
def test_every_check_names_an_existing_rule_or_workload(pair):
    m = load_translation(*pair)
    assert unresolved_checks(m) == []
    assert m.all_checks()


def test_metal_map_has_the_limits_that_matter():
    m = load_translation("cuda", "metal")
    text = json.dumps(as_dict(m))
    for needle in ("32 KB", "48 KB", "227 KB", "1024", "400 GB/s", "4.8 TB/s", "simd_shuffle_xor",
                   "threadgroup_barrier(mem_flags::mem_threadgroup)", "simdgroup_matrix"):
        assert needle in text, needle
    ids = {p.id for p in m.patterns}
    assert {"row-reduction-in-registers", "exp2-trick", "online-softmax", "k-transposed",
            "chunked-scan-with-carries", "vectorized-loads"} <= ids
    checked = {c.check for c in m.concepts if c.check}
    assert {"threadgroup-memory", "cuda-warp-intrinsic", "cuda-barrier", "threads-per-threadgroup"} <= checked


def test_unresolved_checks_are_reported(tmp_path):
    m = load_translation("cuda", "metal")
    bad = m.model_copy(update={"assertions": [m.assertions[0].model_copy(update={"checks": [
        Check(rule="no-such-rule", target="metal"), Check(workload="no-such", task="selective-scan")]})]})
    problems = unresolved_checks(bad)
    assert len(problems) == 2 and "no such rule" in problems[0] and "no such workload" in problems[1]


def test_malformed_maps_name_the_field(tmp_path):
    p = tmp_path / "cuda-x.yaml"
    p.write_text("from: cuda\nto: x\ntitle: t\nsources: {a: b}\nconcepts:\n"
                 "  - {concept: warp, equivalent: lanes, note: n, source: missing}\n")
    with pytest.raises(KnowledgeError, match="source 'missing'"):
        load_translation_file(p)
    p.write_text("from: cuda\nto: x\ntitle: t\nsources: {a: b}\nconcepts:\n"
                 "  - {concept: warp, equivalent: lanes, note: n, source: a, bogus: 1}\n")
    with pytest.raises(KnowledgeError, match="bogus"):
        load_translation_file(p)
    with pytest.raises(KnowledgeError, match="available"):
        load_translation("cuda", "rocm")
    with pytest.raises(ValueError):
        Check(rule="x")


def test_selective_scan_check_workloads_are_cheap_and_marked_check():
    from ksearch.tasks import load_task

    for task in ("selective-scan", "selective-scan-fp16"):
        w = load_task(task).workload("long-seq")
        assert w.purpose == "check" and w.axes["seqlen"] >= 8000 and w.axes["batch"] * w.axes["dim"] <= 8


@pytest.mark.parametrize("to", ["metal", "cpu", "triton"])
def test_knowledge_show(to):
    r = CliRunner().invoke(app, ["knowledge", "show", "--from", "cuda", "--to", to])
    assert r.exit_code == 0, r.output
    assert "## Concept map" in r.output and "## Code patterns" in r.output and "## Assertions" in r.output
    r = CliRunner().invoke(app, ["knowledge", "show", "--to", to, "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["from"] == "cuda" and d["to"] == to and d["concepts"] and d["assertions"]


def test_knowledge_show_metal_text():
    r = CliRunner().invoke(app, ["knowledge", "show", "--from", "cuda", "--to", "metal"])
    assert "__shared__ -> threadgroup T buf[N]" in r.output and "checked by: static rule metal/threadgroup-memory" in r.output
    assert "simd_shuffle_xor(m, 1)" in r.output


def test_knowledge_show_unknown_pair_is_one_readable_error():
    r = CliRunner().invoke(app, ["knowledge", "show", "--to", "rocm"])
    assert r.exit_code != 0 and isinstance(r.exception, KnowledgeError)


def test_an_assertion_without_a_check_must_say_why():
    from ksearch.knowledge.translation import Assertion

    with pytest.raises(ValueError, match="has no check"):
        Assertion(id="x", property="p", why="w")
    assert Assertion(id="x", property="p", why="w", note="no attention task yet").checks == []
    for pair in available():
        for a in load_translation(*pair).assertions:
            assert a.checks or a.note, f"{pair}: {a.id}"


@pytest.mark.parametrize("pair", available(), ids=lambda p: "-".join(p))
def test_every_map_checks_the_extreme_dt_property(pair):
    """The property workload of issue 7 is named by an assertion of every map, for both dtypes."""
    checks = {(c.task, c.workload) for a in load_translation(*pair).assertions for c in a.checks}
    assert {("selective-scan", "extreme-dt"), ("selective-scan-fp16", "extreme-dt")} <= checks


@pytest.mark.parametrize("pair", available(), ids=lambda p: "-".join(p))
def test_sources_are_public_documents_not_the_project_brief(pair):
    """`ksearch knowledge show` cited ../shared/reference/*.md, a path outside this repository: every source is a
    document a reader can find (a datasheet, a specification, a paper, a page)."""
    r = CliRunner().invoke(app, ["knowledge", "show", "--from", pair[0], "--to", pair[1]])
    assert r.exit_code == 0, r.output
    assert "shared/reference" not in r.output and "../" not in " ".join(load_translation(*pair).sources.values())
