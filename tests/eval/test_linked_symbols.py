"""The built-library check (eval/linked_symbols.py, static_checks.check_artifact) on hand-made ELF facts: which
symbols, libraries, load-time entries and layouts pass the cpu policy and which are refused, with what reason;
then what read_elf reads from a real build, and the policy file itself."""

import pytest

from ksearch.errors import TargetError
from ksearch.eval import linked_symbols as ls
from ksearch.eval import static_checks as sc
from ksearch.records import Candidate
from ksearch.targets.cpu import CpuTarget
from ksearch.tasks import load_task

POLICY = ls.policy_for("cpu")
RULES = sc.rules_for("cpu")
CAND = Candidate(target="cpu", sources={"kernel.c": "#include <stdio.h>\nvoid run(void) { printf(\"x\"); }\n"})


def crt(name: str, origin: str = "crtstuff.c") -> ls.Symbol:
    return ls.Symbol(name, 0x1000, "STT_FUNC", "STB_LOCAL", ".text", origin)


def facts(**kw) -> ls.ElfFacts:
    """The facts of an honest gcc build, with ``kw`` changed."""
    base = dict(machine="EM_X86_64", needed=["libm.so.6", "libgomp.so.1", "libc.so.6"], has_symtab=True,
                undefined=[("expf", "GLIBC_2.27", "libm.so.6"), ("GOMP_parallel", "GOMP_4.0", "libgomp.so.1"),
                           ("__cxa_finalize", "GLIBC_2.2.5", "libc.so.6"), ("__gmon_start__", "", "")],
                version_files={"libm.so.6", "libgomp.so.1", "libc.so.6"},
                arrays={"init_array": [crt("frame_dummy")], "fini_array": [crt("__do_global_dtors_aux")],
                        "preinit_array": []},
                init=crt("_init", ""), fini=crt("_fini", ""), section_names={".text", ".init_array"})
    base.update(kw)
    return ls.ElfFacts(**base)


def found(f: ls.ElfFacts, cand: Candidate = CAND) -> list[sc.Finding]:
    return ls.check(POLICY, f, cand, RULES, "cpu")


def test_an_honest_build_passes():
    assert found(facts()) == []


@pytest.mark.parametrize("name", [
    "expf", "exp", "tanhf", "log1pf", "sqrtf", "__expf_finite", "_ZGVdN8v_expf", "_ZGVeN16v_tanhf", "_ZGVbN2v_exp",
    "cexpf", "memcpy", "__memcpy_chk", "memset", "malloc", "aligned_alloc", "posix_memalign", "free",
    "GOMP_parallel", "GOMP_loop_nonmonotonic_dynamic_start", "omp_get_thread_num", "__kmpc_fork_call",
    "__stack_chk_fail", "__tls_get_addr", "__assert_fail", "_Znwm", "_ZdlPvm", "_ZnwmSt11align_val_t",
    "__cxa_throw", "__gxx_personality_v0", "_Unwind_Resume", "_ZSt20__throw_length_errorPKc",
    "_ZTISt13runtime_error", "_ZNSt13runtime_errorC1EPKc", "__libc_single_threaded", "pthread_mutex_lock",
])
def test_what_an_honest_kernel_links_is_allowed(name):
    assert POLICY.verdict(name) == (True, None)


@pytest.mark.parametrize("name, family", [
    ("clock_gettime", "timers and clocks"), ("omp_get_wtime", "timers and clocks"),
    ("omp_get_wtick", "timers and clocks"), ("__read_chk", "file descriptors"), ("__printf_chk", "streams"),
    ("__isoc99_scanf", "streams"), ("open64", "files"), ("__open64_2", "files"), ("mmap64", "memory maps"),
    ("_Fork", "processes"), ("GOMP_target_ext", "dynamic loading"), ("omp_target_alloc", "dynamic loading"),
    ("PyRun_SimpleString", "Python C API"), ("_Py_NoneStruct", "Python C API"),
    ("__libc_dlopen_mode", "C library internals"), ("_IO_2_1_stdout_", "C library internals"),
    ("_ZNSt6chrono3_V212steady_clock3nowEv", "timers and clocks"),
    ("_ZNSt6thread15_M_start_threadESt10unique_ptrINS_6_StateESt14default_deleteIS1_EEPFvvE", "threads"),
    ("_ZSt4cout", "streams"), ("_ZNSt13random_device7_M_initERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE",
                               "/proc, /sys and /dev"),
    ("getpid", "not on the allow-list"), ("memcpy@GLIBC_2.2.5", "not on the allow-list"),
])
def test_refused_symbols_say_their_family(name, family):
    got = found(facts(undefined=[(name, "", "")]))
    assert [f.text for f in got] == [f"linked symbol {name!r} is not allowed for cpu kernels"]
    assert got[0].rule == "linked-symbol" and got[0].kind == "artifact" and got[0].why.startswith(family + ":"), \
        got[0].why


def test_a_private_version_of_an_allowed_name_is_refused():
    assert [f.rule for f in found(facts(undefined=[("memcpy", "GLIBC_PRIVATE", "libc.so.6")]))] == ["linked-symbol"]


def test_the_message_points_at_the_source_that_names_the_symbol():
    (f,) = found(facts(undefined=[("__printf_chk", "GLIBC_2.3.4", "libc.so.6")]))
    assert (f.file, f.line) == ("kernel.c", 2)
    assert str(f) == ("static check 'linked-symbol': linked symbol '__printf_chk' is not allowed for cpu kernels "
                      f"(streams: {next(r.why for r in RULES if r.id == 'streams')}); kernel.c:2 names it")


@pytest.mark.parametrize("change, text", [
    (dict(needed=["libc.so.6", "libopenblas.so.0"]), "linked library 'libopenblas.so.0'"),
    (dict(version_files={"libc.so.6", "libpython3.11.so.1.0"}), "linked library 'libpython3.11.so.1.0'"),
    (dict(search_tags=[("DT_RUNPATH", "/tmp/evil")]), "DT_RUNPATH '/tmp/evil'"),
    (dict(search_tags=[("DT_AUDIT", "libaudit.so")]), "DT_AUDIT 'libaudit.so'"),
])
def test_libraries_and_search_paths(change, text):
    got = found(facts(**change))
    assert [f.rule for f in got] == ["linked-library"] and got[0].text.startswith(text), [str(f) for f in got]


@pytest.mark.parametrize("entries, text", [
    ([crt("frame_dummy"), crt("frame_dummy")], "'frame_dummy' more often"),
    ([crt("frame_dummy"), crt("at_load_", "kernel.c")], "'at_load_' of kernel.c"),
    ([crt("frame_dummy", "kernel.c")], "'frame_dummy' of kernel.c"),
    ([crt("frame_dummy"), ls.Symbol("at_load_", 0x1100, "STT_FUNC", "STB_GLOBAL", ".text")], "global function"),
    ([crt("frame_dummy"), "the external symbol 'abort'"], "the external symbol 'abort'"),
    ([crt("frame_dummy"), "address 0x1234"], "address 0x1234"),
    ([crt("frame_dummy"), crt("unknown_crt_function")], "'unknown_crt_function'"),
])
def test_init_array_entries_beyond_the_compilers_own(entries, text):
    got = found(facts(arrays={"init_array": entries, "fini_array": [], "preinit_array": []}))
    assert [f.rule for f in got] == ["load-time-code"] and text in got[0].text, [str(f) for f in got]


def test_fast_math_start_up_entry_passes_and_preinit_entries_do_not():
    ok = facts(arrays={"init_array": [crt("set_fast_math", "crtfastmath.c"), crt("frame_dummy")],
                       "fini_array": [crt("__do_global_dtors_aux")], "preinit_array": []})
    assert found(ok) == []
    bad = facts(arrays={"init_array": [], "fini_array": [], "preinit_array": [crt("frame_dummy")]})
    assert [f.rule for f in found(bad)] == ["load-time-code"]


@pytest.mark.parametrize("change, rule, text", [
    (dict(has_symtab=False), "load-time-code", "cannot name"),
    (dict(init=crt("at_load_", "kernel.c")), "load-time-code", "DT_INIT"),
    (dict(fini=crt("not_fini")), "load-time-code", "DT_FINI"),
    (dict(symbols=[ls.Symbol("sneak_", 0x1000, "STT_FUNC", "STB_LOCAL", ".init", "kernel.c")]), "load-time-code",
     "lies in .init"),
    (dict(section_names={".text", ".ctors"}), "load-time-code", ".ctors"),
    (dict(ifuncs=["twice_"]), "load-time-code", "IFUNC"),
    (dict(irelative=1), "load-time-code", "IFUNC"),
    (dict(exec_stack=True), "binary-layout", "executable stack"),
    (dict(wx_segments=1), "binary-layout", "writable and executable"),
    (dict(textrel=True), "binary-layout", "text relocations"),
])
def test_load_time_code_and_layout(change, rule, text):
    got = found(facts(**change))
    assert got and {f.rule for f in got} == {rule} and any(text in f.text for f in got), [str(f) for f in got]


@pytest.mark.parametrize("name, family", [("clock_gettime", "timers and clocks"), ("memcpy", "memory and strings"),
                                          ("expf", "math library"), ("GOMP_parallel", "OpenMP runtime")])
def test_exported_definitions_with_a_librarys_name_are_refused(name, family):
    got = found(facts(exported=["run", name, "helper_exp", "_ZNSt6vectorIfSaIfEE17_M_default_appendEm"]))
    assert [(f.rule, f.text) for f in got] == [
        ("interpose-libc", f"the built library defines {name!r}, a name of the libraries it links against")]
    assert got[0].why.startswith(family + ":")


# -- a real build, the policy file ----------------------------------------------------------------------------


def test_read_elf_of_a_real_build():
    task = load_task("selective-scan")
    cand = Candidate(target="cpu", sources={"kernel.c": task.naive_sources["cpu"]})
    res = CpuTarget().compile(cand, task.definition)
    assert res.ok, res.log
    f = ls.read_elf(res.artifact)
    assert f.machine in ("EM_X86_64", "EM_AARCH64") and "libc.so.6" in f.needed and f.has_symtab
    assert {n for n, _, _ in f.undefined} >= {"expf", "malloc", "free"}
    assert [(e.name, e.origin) for e in f.arrays["init_array"]] == [("frame_dummy", "crtstuff.c")]
    assert f.init.name == "_init" and not (f.exec_stack or f.wx_segments or f.textrel or f.ifuncs)
    assert sc.check_artifact("cpu", res.artifact, cand) == []


def test_a_file_that_is_not_elf_is_one_finding_and_targets_without_a_policy_pass(tmp_path):
    bogus = tmp_path / "kernel.so"
    bogus.write_bytes(b"\x7fELF" + b"\x00" * 12)
    (f,) = sc.check_artifact("cpu", bogus, CAND)
    assert f.rule == "binary-layout" and "cannot be read as ELF" in f.text
    assert sc.check_artifact("cuda", bogus, CAND) == [] and ls.policy_for("cuda") is None


def test_the_policy_file_loads_and_a_malformed_one_is_an_error(tmp_path, monkeypatch):
    assert POLICY is not None and len(POLICY.symbols) >= 6 and POLICY.load_time.init_array["frame_dummy"] == 1
    assert all(ex.rule in {r.id for r in RULES} for ex in POLICY.explain)
    (tmp_path / "bad.symbols.yaml").write_text("libraries: []\nsymbols:\n  - {family: x, why: y, patterns: ['(']}\n")
    monkeypatch.setattr(ls, "RULES_DIR", tmp_path)
    ls.policy_for.cache_clear()
    try:
        with pytest.raises(TargetError, match="bad.symbols.yaml is malformed"):
            ls.policy_for("bad")
    finally:
        ls.policy_for.cache_clear()
