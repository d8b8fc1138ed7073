"""Static checks of the cpu target: the rules load, honest kernels pass, hostile ones are caught with the
rule and the line, and the usual disguises (macros, comments, strings, C++ blocks) neither hide a call nor
make an honest kernel fail."""

import pytest

from ksearch.eval import static_checks as sc
from ksearch.eval.records import Candidate
from ksearch.knowledge import load_pack
from ksearch.targets.cpu import CpuTarget
from ksearch.tasks import load_task

from ..knowledge.paths import random_paths

RULES = sc.rules_for("cpu")
EXPAND = CpuTarget().expand


def findings(src: str, name: str = "kernel.c", expand=EXPAND, **kw) -> list[sc.Finding]:
    return sc.check(Candidate(target="cpu", sources={name: src}, **kw), RULES, expand)


def rules_hit(src: str, **kw) -> set[str]:
    return {f.rule for f in findings(src, **kw)}


def test_rules_load_and_every_rule_says_why():
    assert len(RULES) >= 12 and len({r.id for r in RULES}) == len(RULES)
    assert all(r.why and r.view in ("text", "code", "definitions", "includes") for r in RULES)
    assert sc.rules_for("no-such-target") == ()


@pytest.mark.parametrize("task", ["selective-scan", "selective-scan-fp16"])
def test_naive_and_rendered_pack_kernels_pass(task):
    t = load_task(task)
    assert findings(t.naive_sources["cpu"]) == []
    pack = load_pack("selective-scan", "cpu")
    paths = [({"family": f.id}, {}) for f in pack.families] + random_paths(pack, 6, seed=7)
    for choices, knobs in paths:
        kernel = pack.render(t.definition, choices, knobs)
        got = findings(kernel.sources["kernel.c"], compile_flags=list(kernel.compile_flags))
        assert got == [], f"{choices} {knobs}: {[str(f) for f in got]}"


HONEST_LOOKALIKES = """#include <stdio.h>
#include <stdint.h>
/* system("rm -rf /"); fork(); dlopen() -- only a comment */
// popen and clock_gettime in a line comment
static double my_clock(double time_constant) { return time_constant; }   /* names containing 'time' */
void run(float *out, int64_t n) {
    int64_t system_size = n;                     /* an identifier that starts with 'system' */
    fprintf(stderr, "fork() would be wrong here; see /home/docs\\n");
    #pragma omp parallel for simd
    for (int64_t i = 0; i < system_size; i++) out[i] = (float)my_clock(1.0);
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
    ("load-time-code", "#pragma redefine_extname my_system system\nvoid run(void) {}"),
    ("interpose-libc", "#include <stddef.h>\nvoid *malloc(size_t n) { return 0; }\nvoid run(void) {}"),
    ("interpose-libc", "int clock_gettime(int c, void *t) { return 0; }\nvoid run(void) {}"),
    ("foreign-include", '#include "/etc/hostname"\nvoid run(void) {}'),
])
def test_hostile_snippets_are_caught(rule, snippet):
    assert rule in rules_hit(snippet), [str(f) for f in findings(snippet)]


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
