"""Static checks of the cpu target: the rules load, honest kernels pass (the source rules and the built-library
check), hostile ones are caught with the rule and the line, and the usual disguises (macros, comments, strings,
C++ blocks) neither hide a call nor make an honest kernel fail; the views the rules read (directives,
attributes, identifiers with the C library's decorations) on small inputs. Evasions of these checks:
tests/eval/adversarial/test_static_evasion.py; the built-library check on its own: test_linked_symbols.py."""

import pytest

from ksearch.errors import TargetError
from ksearch.eval import c_scan
from ksearch.eval import static_checks as sc
from ksearch.records import Candidate
from ksearch.knowledge import load_pack
from ksearch.targets.cpu import CpuTarget
from ksearch.tasks import load_task

from ..knowledge.paths import random_paths

RULES = sc.rules_for("cpu")
EXPAND = CpuTarget().expand
#: every built-in task with a cpu naive kernel, and the knowledge pack it renders from
CPU_TASKS = ["selective-scan", "selective-scan-fp16", "attention-prefill", "attention-prefill-bf16",
             "attention-prefill-noncausal", "attention-prefill-noncausal-bf16", "attention-decode"]


def findings(src: str, name: str = "kernel.c", expand=EXPAND, **kw) -> list[sc.Finding]:
    return sc.check(Candidate(target="cpu", sources={name: src}, **kw), RULES, expand)


def rules_hit(src: str, **kw) -> set[str]:
    return {f.rule for f in findings(src, **kw)}


def test_rules_load_and_every_rule_says_why():
    assert len(RULES) >= 20 and len({r.id for r in RULES}) == len(RULES)
    assert all(r.why and r.family and r.view in ("text", "code", "definitions", "includes", "directives",
                                                 "attributes", "flags") for r in RULES)
    assert all(len(r.why) <= 160 for r in RULES), [r.id for r in RULES if len(r.why) > 160]  # the prompt's cut
    assert sc.rules_for("no-such-target") == ()


def _sample(task: str) -> list[tuple[str, Candidate]]:
    """The task's naive kernel, each pack family's default path and, for the first task of each pack, two
    random paths (seeded by the task)."""
    t = load_task(task)
    out = [("naive", Candidate(target="cpu", sources={"kernel.c": t.naive_sources["cpu"]}))]
    pack = load_pack(t.definition.name, "cpu")
    extra = random_paths(pack, 2, seed=len(task)) if task in ("selective-scan", "attention-prefill",
                                                              "attention-decode") else []
    paths = [({"family": f.id}, {}) for f in pack.families] + extra
    seen = set()
    for choices, knobs in paths:
        kernel = pack.render(t.definition, choices, knobs)
        cand = kernel.candidate()
        if cand.id not in seen:
            seen.add(cand.id)
            out.append((f"{choices} {knobs}", cand))
    return out


@pytest.mark.parametrize("task", CPU_TASKS)
def test_naive_and_rendered_pack_kernels_pass_the_rules_and_the_built_library_check(task):
    """A sample per task (all 210 single moves of every pack passed too: see docs/evaluation.md)."""
    definition = load_task(task).definition
    for label, cand in _sample(task):
        got = sc.check(cand, RULES, EXPAND)
        assert got == [], f"{label}: {[str(f) for f in got]}"
        built = CpuTarget().compile(cand, definition)
        assert built.ok, f"{label}: {built.log}"
        got = sc.check_artifact("cpu", built.artifact, cand)
        assert got == [], f"{label}: {[str(f) for f in got]}"


HONEST_LOOKALIKES = """#include <stdio.h>
#include <stdint.h>
#include <x86intrin.h>
/* system("rm -rf /"); fork(); dlopen(); #line 1 "x" -- only a comment */
// popen and clock_gettime in a line comment
#include <sys/timex.h>
typedef float __attribute__((may_alias, aligned(4))) aliased_float;
static double my_clock(double time_constant) { return time_constant; }   /* names containing 'time' */
static const char *const kNote = "fork() would be wrong here; see /home/docs";
void run(float *out, int64_t n) {
    int64_t system_size = n;                     /* an identifier that starts with 'system' */
    struct timex s = {0}, *p = &s;
    int64_t ticks = s.time.tv_sec + p->time.tv_usec; /* members named like functions */
    static int64_t counter;
    __sync_fetch_and_add(&counter, 1);
    _mm_pause();
    (void)kNote;
    #pragma omp parallel for simd
    for (int64_t i = 0; i < system_size; i++) out[i] = (float)my_clock(1.0) + (float)ticks;
}
"""


def test_honest_lookalikes_pass():
    assert findings(HONEST_LOOKALIKES) == []


@pytest.mark.parametrize("rule, snippet", [
    ("shell-out", 'void run(void) { system("ls"); }'),
    ("shell-out", "int (*f)(const char *) = &system; void run(void) {}"),
    ("shell-out", '#define S(x) sys##tem(x)\nvoid run(void) { S("ls"); }'),
    ("shell-out", "#define CALL(f, a) f(a)\nvoid run(void) { CALL(popen, 0); }"),
    ("dynamic-loading", '#include <dlfcn.h>\nvoid run(void) { dlsym(RTLD_DEFAULT, "cblas_sgemm"); }'),
    ("replaced-library", "#include <cblas.h>\nvoid run(void) {}"),
    ("threads", "#include <pthread.h>\nvoid run(void) { pthread_t t; pthread_create(&t, 0, 0, 0); }"),
    ("timer", "#include <x86intrin.h>\nvoid run(void) { unsigned long long t = __rdtsc(); (void)t; }"),
    ("timer", "#include <time.h>\nvoid run(void) { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); }"),
    ("other-processes", "#include <stdlib.h>\nvoid run(void) { getenv(\"OPENAI_API_KEY\"); }"),
    ("proc-and-devices", 'void run(void) { const char *p = "/proc/self/mem"; (void)p; }'),
    ("files", '#include <stdio.h>\nvoid run(void) { fopen("x", "r"); }'),
    ("raw-io", "#include <unistd.h>\nvoid run(void) { write(4, \"{}\", 2); }"),
    ("network", "#include <sys/socket.h>\nvoid run(void) { socket(2, 1, 0); }"),
    ("signals", "#include <signal.h>\nvoid run(void) { signal(SIGSEGV, SIG_IGN); }"),
    ("inline-asm", 'void run(void) { __asm__ volatile("nop"); }'),
    ("load-time-code", "__attribute__((constructor)) static void init(void) {}\nvoid run(void) {}"),
    ("symbol-pragmas", "#pragma redefine_extname my_system system\nvoid run(void) {}"),
    ("load-time-code", "__attribute__((used, destructor)) static void bye(void) {}\nvoid run(void) {}"),
    ("line-directive", '#line 10 "/usr/include/math.h"\nvoid run(void) {}'),
    ("compile-flags", None),
    ("python-api", "#define API(x) Py##x\nint API(_IsInitialized)(void);\nvoid run(void) { API(_IsInitialized)(); }"),
    ("libc-internals", "extern void *_r_debug;\nvoid run(void) { void *p = &_r_debug; (void)p; }"),
    ("memory-maps", "#include <sys/mman.h>\nvoid run(float *p) { mprotect(p, 4096, PROT_READ | PROT_EXEC); }"),
    ("process-control", "#include <stdlib.h>\nvoid run(void) { atexit(0); }"),
    ("streams", '#include <stdio.h>\nvoid run(void) { fprintf(stderr, "x"); }'),
    ("stack-walking", "void run(void) { void *r = __builtin_return_address(0); (void)r; }"),
    ("timer", '#include <chrono>\nusing namespace std;\nextern "C" void run() { (void)chrono::steady_clock::now(); }'),
    ("timer", '#include <chrono>\nusing namespace std::chrono;\nextern "C" void run() { (void)steady_clock::now(); }'),
    ("streams", "#include <iostream>\nusing namespace std;\nextern \"C\" void run() { cout << 1; }"),
    ("files", "#include <filesystem>\nnamespace fs = std::filesystem;\nextern \"C\" void run() { fs::remove(\"x\"); }"),
    ("interpose-libc", "#include <stddef.h>\nvoid *malloc(size_t n) { return 0; }\nvoid run(void) {}"),
    ("interpose-libc", "int clock_gettime(int c, void *t) { return 0; }\nvoid run(void) {}"),
    ("foreign-include", '#include "/etc/hostname"\nvoid run(void) {}'),
])
def test_hostile_snippets_are_caught(rule, snippet):
    if snippet is None:  # a flag the preprocessor's output depends on
        assert rule in rules_hit("void run(void) {}", compile_flags=["-C"])
        return
    name = "kernel.cpp" if "extern \"C\" void run()" in snippet else "kernel.c"
    assert rule in rules_hit(snippet, name=name), [str(f) for f in findings(snippet, name=name)]


def test_a_stringified_name_is_a_string_and_a_pasted_one_a_name():
    head = "#include <dlfcn.h>\n#define STR(x) #x\n#define CAT(a, b) a##b\n"
    assert findings(head + "static const char *const k = STR(clock_gettime);\nvoid run(void) { (void)k; }") == []
    assert "dynamic-loading" in rules_hit(head + "void run(void) { dlsym(RTLD_DEFAULT, STR(clock_gettime)); }")
    assert "timer" in rules_hit(head + "void run(void) { void *p = (void *)&CAT(clock_, gettime); (void)p; }")


def test_cxx_extern_c_block_and_line_numbers():
    src = 'extern "C" {\n\nvoid *memcpy(void *d, const void *s, unsigned long n) { return d; }\n}\nextern "C" void run() {}\n'
    got = [f for f in findings(src, name="kernel.cpp") if f.rule == "interpose-libc"]
    assert got and got[0].line == 3 and got[0].file == "kernel.cpp"
    assert "kernel.cpp:3" in str(got[0]) and "memcpy" in str(got[0])


def test_without_a_preprocessor_the_text_is_checked():
    assert "shell-out" in rules_hit('void run(void) { system("ls"); }', expand=None)
    assert rules_hit(HONEST_LOOKALIKES, expand=None) == set()


def test_definitions_at_file_scope():
    code = sc.strip_c('struct S { int a; };\nstatic int f(int x) { if (x) { return 1; } return 0; }\n'
                      'int g[] = {1, 2};\nint h(void)\n{ return 0; }\n', keep_strings=False)
    assert sc.defined_functions(code) == [(2, "f"), (4, "h")]


@pytest.mark.parametrize("flag", ["-I/root", "-include/etc/passwd", "-isystem/x", "-Xlinker", "-fprofile-generate=/tmp/p"])
def test_flags_that_include_or_write_files_are_refused(flag):
    cand = Candidate(target="cpu", sources={"kernel.c": "void run(void) {}"}, compile_flags=[flag])
    assert not CpuTarget().compile(cand, load_task("selective-scan").definition).ok


def test_a_rule_file_can_include_another(tmp_path, monkeypatch):
    """``include: base`` puts base.yaml's rules and limits first; the file's own limits override by name."""
    from ksearch.eval import static_checks as sc

    (tmp_path / "base.yaml").write_text(
        "limits:\n  lim: {value: 4, unit: bytes, source: base}\n"
        "rules:\n  - {id: no-goto, why: no goto, in: code, pattern: '\\bgoto\\b'}\n")
    (tmp_path / "child.yaml").write_text(
        "include: base\nlimits:\n  lim: {value: 8, unit: bytes, source: child}\n"
        "rules:\n  - {id: no-asm, why: no asm, in: code, pattern: '\\basm\\b'}\n")
    monkeypatch.setattr(sc, "RULES_DIR", tmp_path)
    sc._rule_file.cache_clear()
    try:
        assert [r.id for r in sc.rules_for("child")] == ["no-goto", "no-asm"]
        assert sc.limits_for("child")["lim"].value == 8 and sc.limits_for("base")["lim"].value == 4
    finally:
        sc._rule_file.cache_clear()


# -- the views and the rule format ----------------------------------------------------------------------------


@pytest.mark.parametrize("source, expect", [
    ('#line 7 "x"\n', [(1, '#line 7 "x"')]),
    ('int a;\n  #  pragma omp parallel for // c\n#include <stdio.h>\n#\n',
     [(2, "#pragma omp parallel for"), (3, "#include <stdio.h>"), (4, "#")]),
    ('#li\\\nne 7 "x"\nint b;\n', [(1, '#line 7 "x"')]),
    ('%: /* a\nb */ line 7 "x"\n', [(1, '#line 7 "x"')]),
    ('/*\n*/ # 7 "x"\n', [(1, '#7 "x"')]),
    ('int b; /*\n*/ # 7 "x"\n', []),  # not at the start of a line: not a directive (gcc -E agrees)
    ('??=line 3\n', [(1, "#line 3")]),
    ('int a;\r#line 3\n', [(2, "#line 3")]),
])
def test_directives_view(source, expect):
    assert [d for d in c_scan.directives(source) if not d[1].startswith("#li \\")] == expect


def test_splices_keep_the_line_numbers_after_them():
    assert c_scan.splice("ab\\\ncd\nef\\  \ngh\nij") == "abcd\n\nef\\  \ngh\nij"
    assert c_scan.splice("ab\\\ncd\nef\\  \ngh\nij", lax=True) == "abcd\n\nefgh\n\nij"


def test_attributes_view_balances_parentheses_and_reads_double_underscores():
    code = ("int x __attribute__((aligned((((8)))), __constructor__)) = 1;\n[[gnu::destructor]] void f();\n"
            "__attribute((section(\"   \"))) int y;\n")
    assert c_scan.attributes(code) == [(0, "aligned((((8)))), constructor"), (1, "gnu::destructor"),
                                       (2, 'section(" ")')]


@pytest.mark.parametrize("text, hit", [
    ("read(fd, p, n)", True), ("&read", True), ("(read)(0, p, 1)", True), ("std::read", True),
    ("__read_chk(0, p, 1, 1)", True), ("open64(p, 0)", True), ("__open64_2(p, 0)", True),
    ("__builtin_read", True), ("thread", False), ("s.read", False), ("p->read", False), ("read_count", False),
    ("x$read", False), ("#include <sys/read.h>", False), ("unread(x)", False),
])
def test_names_match_identifiers_with_the_c_librarys_decorations(text, hit):
    import re

    assert bool(re.search(sc.names_pattern(["read", "open"]), text)) is hit


def test_rule_format_errors(tmp_path, monkeypatch):
    monkeypatch.setattr(sc, "RULES_DIR", tmp_path)
    for body, match in [("{id: a, why: b, names: ['not a name']}", "not a C identifier"),
                        ("{id: a, why: b, pattern: x, allow: y}", "give a pattern"),
                        ("{id: a, why: b}", "give a pattern")]:
        (tmp_path / "bad.yaml").write_text(f"rules:\n  - {body}\n")
        sc._rule_file.cache_clear()
        try:
            with pytest.raises(TargetError, match=match):
                sc.rules_for("bad")
        finally:
            sc._rule_file.cache_clear()


def test_an_allow_rule_fires_on_the_first_line_it_does_not_match(tmp_path, monkeypatch):
    (tmp_path / "t.yaml").write_text("rules:\n  - {id: flags, why: only -O, in: flags, allow: '-O[0-3]'}\n")
    monkeypatch.setattr(sc, "RULES_DIR", tmp_path)
    sc._rule_file.cache_clear()
    try:
        rules = sc.rules_for("t")
        cand = Candidate(target="cpu", sources={"k.c": ""}, compile_flags=["-O2", "-P", "-C"])
        assert [(f.file, f.line, f.text) for f in sc.check(cand, rules)] == [(sc.FLAGS_FILE, 2, "-P")]
        assert sc.check(Candidate(target="cpu", sources={"k.c": ""}, compile_flags=["-O3"]), rules) == []
    finally:
        sc._rule_file.cache_clear()
