"""Evasions of the cpu static checks (hostile_static.py): directives that blind the `code` view in every
spelling the compiler honours, forbidden names reached without a plain call, and what only the built library
shows; each caught with the rule that names it, honest kernels beside them passing."""

import pytest

from ksearch.eval import static_checks as sc
from ksearch.records import Candidate
from ksearch.targets.cpu import CpuTarget
from ksearch.tasks import load_task

from . import hostile_static as h

RULES = sc.rules_for("cpu")
EXPAND = CpuTarget().expand
DEFINITION = load_task("selective-scan").definition


def cand(src: str, flags=(), name: str = "kernel.c") -> Candidate:
    return Candidate(target="cpu", sources={name: src}, compile_flags=list(flags))


def rules_hit(c: Candidate, rules=RULES) -> set[str]:
    return {f.rule for f in sc.check(c, rules, EXPAND)}


def built(c: Candidate):
    res = CpuTarget().compile(c, DEFINITION)
    assert res.ok, res.log
    return res.artifact


@pytest.mark.parametrize("spelling", sorted(h.BLINDING))
def test_a_directive_that_blinds_the_code_view_is_rejected(spelling):
    src, flags = h.blinded(spelling)
    assert "line-directive" in rules_hit(cand(src, flags)), spelling
    # the compiler honoured the spelling and still compiled the clock read: the attack is real
    syms = {f.text for f in sc.check_artifact("cpu", built(cand(src, flags)), cand(src, flags))}
    assert "linked symbol 'clock_gettime' is not allowed for cpu kernels" in syms


def test_without_the_directive_rule_the_blinded_kernel_shows_nothing():
    """What the rule defends: behind a GNU line marker the other rules see no line of the kernel."""
    src, flags = h.blinded("gnu-line-marker")
    others = tuple(r for r in RULES if r.id != "line-directive")
    assert "timer" not in rules_hit(cand(src, flags), others)
    assert "timer" in rules_hit(cand(h.honest(head="#include <time.h>\n", post=h.CLOCK_READ)), others)


@pytest.mark.parametrize("rule, src", h.HIDDEN_NAMES, ids=[f"{r}-{i}" for i, (r, _) in enumerate(h.HIDDEN_NAMES)])
def test_a_hidden_forbidden_name_is_caught(rule, src):
    got = rules_hit(cand(src))
    assert rule in got, (rule, got)


@pytest.mark.parametrize("flag", ["-P", "-C", "-fdirectives-only", "-xassembler-with-cpp", "-finput-charset=UTF-7"])
def test_flags_that_change_what_the_preprocessor_prints_are_rejected(flag):
    c = cand(h.honest(), [flag])
    assert "compile-flags" in rules_hit(c)
    assert not CpuTarget().compile(c, DEFINITION).ok  # the target refuses them too, before any compiler runs


def test_honest_kernels_pass_the_source_rules():
    for c in (cand(h.NAIVE), cand(h.HONEST_MVEC), cand(h.HONEST_FAST_MATH[0], h.HONEST_FAST_MATH[1]),
              cand(h.HONEST_CXX, name="kernel.cpp")):
        assert sc.check(c, RULES, EXPAND) == [], [str(f) for f in sc.check(c, RULES, EXPAND)]


# -- the built library ----------------------------------------------------------------------------------------


def artifact_findings(src: str, flags=(), name: str = "kernel.c") -> list[sc.Finding]:
    c = cand(src, flags, name)
    return sc.check_artifact("cpu", built(c), c)


@pytest.fixture(scope="module")
def link_table():
    """The findings of one build that takes the address of a function of every forbidden family."""
    return artifact_findings(h.LINK_TABLE)


@pytest.mark.parametrize("name", sorted(h.LINKED_NAMES))
def test_every_forbidden_family_is_refused_when_linked(link_table, name):
    got = [f for f in link_table if f.text == f"linked symbol {name!r} is not allowed for cpu kernels"]
    assert got, [str(f) for f in link_table]
    assert got[0].rule == "linked-symbol" and got[0].why.startswith(h.LINKED_NAMES[name] + ":"), str(got[0])


@pytest.mark.parametrize("kernel", ["WEAK_CLOCK", "VERSIONED_CLOCK", "PASTED_CLOCK_POINTER"])
def test_weak_versioned_and_pasted_clock_references_are_refused(kernel):
    texts = [str(f) for f in artifact_findings(getattr(h, kernel))]
    assert any("linked symbol 'clock_gettime' is not allowed for cpu kernels (timers and clocks:" in t
               for t in texts), texts


def test_the_python_c_api_by_pasted_names_is_refused():
    texts = {f.text for f in artifact_findings(h.PASTED_PYTHON)}
    assert {f"linked symbol {n!r} is not allowed for cpu kernels"
            for n in ("PyGILState_Ensure", "PyRun_SimpleString", "PyGILState_Release")} <= texts


def test_a_cxx_static_initialiser_no_source_rule_sees_is_refused():
    c = cand(h.CXX_STATIC_INIT, name="kernel.cpp")
    assert sc.check(c, RULES, EXPAND) == []
    got = sc.check_artifact("cpu", built(c), c)
    assert [f.rule for f in got] == ["load-time-code"], [str(f) for f in got]
    assert "_GLOBAL__sub_I_" in got[0].text and "kernel.cpp" in got[0].text


@pytest.mark.parametrize("kernel, expect", [
    ("CONSTRUCTOR", "'at_load_' of kernel.c"),
    ("SPOOFED_CONSTRUCTOR", "'frame_dummy' of kernel.c"),
    ("INIT_ARRAY_LIBC", "the external symbol 'abort'"),
    ("IN_INIT_SECTION", "'in_init_' of kernel.c lies in .init"),
    ("TARGET_CLONES", "IFUNC"),
])
def test_code_run_at_load_is_refused(kernel, expect):
    texts = [f.text for f in artifact_findings(getattr(h, kernel)) if f.rule == "load-time-code"]
    assert any(expect in t for t in texts), texts


def test_an_executable_stack_is_refused():
    got = artifact_findings(h.NESTED_FUNCTION)
    assert [f.text for f in got] == ["the built library asks for an executable stack"], [str(f) for f in got]


def test_a_clock_defined_under_a_parenthesised_name_is_refused_in_the_built_library():
    c = cand(h.PAREN_DEFINED_CLOCK)
    assert "interpose-libc" not in rules_hit(c)  # the definitions view reads `name(`, not `(name)(`
    got = [f for f in sc.check_artifact("cpu", built(c), c) if f.rule == "interpose-libc"]
    assert [f.text for f in got] == ["the built library defines 'clock_gettime', a name of the libraries it links "
                                     "against"]


def test_cxx_clocks_threads_and_streams_are_refused_by_their_mangled_names():
    got = artifact_findings(h.CXX_FORBIDDEN, name="kernel.cpp")
    families = {f.why.split(":")[0] for f in got if f.rule == "linked-symbol"}
    assert {"timers and clocks", "threads", "streams"} <= families, [str(f) for f in got]


def test_honest_kernels_pass_the_built_library_check():
    for src, flags, name in ((h.NAIVE, [], "kernel.c"), (h.HONEST_MVEC, [], "kernel.c"),
                             (h.HONEST_FAST_MATH[0], h.HONEST_FAST_MATH[1], "kernel.c"),
                             (h.HONEST_CXX, [], "kernel.cpp")):
        got = artifact_findings(src, flags, name)
        assert got == [], [str(f) for f in got]
