"""Hostile kernels against the cpu static checks: each tries to blind the rules' view of the source, to hide a
forbidden name from them, or to link or run at load what they forbid. Most are the selective-scan naive kernel
with a twist (`hostile.honest`), so the rest of the source is one the checks must pass.

- `BLINDING`: a directive that makes the compiler attribute the kernel's lines to a system header (the `code`
  view reads only the candidate's own lines), in every spelling the compiler honours; each hides a clock read.
- `HIDDEN_NAMES`: a forbidden function reached without writing a plain call: a function pointer, its address,
  a cast, a parenthesised call, a pasted name, the C library's fortified, 64-bit and private aliases.
- Kernels the source rules may miss but the built library shows: `LINK_TABLE` (the address of one function of
  each forbidden family, so one build shows them all), a weak reference, a versioned reference, the Python C
  API by a pasted name, a C++ static initialiser, constructors (one named like the compiler's own), an
  .init_array entry that calls a libc function, code placed in .init, an IFUNC, an executable stack, the
  clock defined under a parenthesised name.
- Honest kernels beside them: `HONEST_CXX` (std::vector, std::array, std::min/max, std::exp, new/delete, an
  exception), `HONEST_MVEC` (vectorised libm calls), and the naive kernel with -ffast-math.
"""

from .hostile import HEAD, NAIVE, honest

#: C statements: read the monotonic clock (what a forged timing needs) and use the result
CLOCK_READ = "struct timespec ts_; clock_gettime(CLOCK_MONOTONIC, &ts_); out[0] += (float)(ts_.tv_nsec & 0);"
_TIME_HEAD = "#include <time.h>\n"

#: directive spellings that attribute the lines after them to a system header: (source prefix, extra flags)
BLINDING = {
    "line": ('#line 1 "/usr/include/stdio.h"\n', []),
    "gnu-line-marker": ('# 1 "/usr/include/stdio.h" 3\n', []),
    "digraph": ('%:line 1 "/usr/include/stdio.h"\n', []),
    "spliced-name": ('#li\\\nne 1 "/usr/include/stdio.h"\n', []),
    "splice-with-blank": ('#\\ \nline 1 "/usr/include/stdio.h"\n', []),
    "comments-around": ('/* a\n */ # /* b\n */ line 1 "/usr/include/stdio.h"\n', []),
    "trigraph": ('??=line 1 "/usr/include/stdio.h"\n', ["-std=c11"]),
    "nul-blank": ('\0#line 1 "/usr/include/stdio.h"\n', []),
    "carriage-return": ('int cr_;\r#line 1 "/usr/include/stdio.h"\n', []),
    "byte-order-mark": ('\ufeff#line 1 "/usr/include/stdio.h"\n', []),
}


def blinded(spelling: str) -> tuple[str, list[str]]:
    """The naive kernel reading the clock, behind the directive ``spelling`` (a key of `BLINDING`), and the
    flags it needs."""
    prefix, flags = BLINDING[spelling]
    return prefix + honest(head=_TIME_HEAD, post=CLOCK_READ), flags


#: (rule, kernel): a forbidden name hidden from a call-shaped rule, and the rule that must still see it
HIDDEN_NAMES = [
    ("timer", honest(head=_TIME_HEAD + "static int (*const clock_)(clockid_t, struct timespec *) = clock_gettime;\n")),
    ("timer", honest(head=_TIME_HEAD, post="void *p_ = (void *)&clock_gettime; out[0] += (float)(p_ == 0);")),
    ("timer", honest(head=_TIME_HEAD, post="struct timespec t_; (clock_gettime)(CLOCK_MONOTONIC, &t_);")),
    ("timer", honest(head=_TIME_HEAD, post="struct timespec t_; (*clock_gettime)(CLOCK_MONOTONIC, &t_);")),
    ("timer", honest(head=_TIME_HEAD + "#define CAT(a, b) a##b\n",
                     post="struct timespec t_; CAT(clock_, gettime)(CLOCK_MONOTONIC, &t_);")),
    ("timer", honest(head=_TIME_HEAD + "#define CAT(a, b) a##b\n#define CLK CAT(clock_, gettime)\n",
                     post="long (*f_)(void) = (long (*)(void))CLK; out[0] += (float)(f_ == 0);")),
    ("timer", honest(head="#include <omp.h>\n", post="out[0] += (float)(omp_get_wtime() * 0);")),
    ("timer", honest(head="#include <x86intrin.h>\n", post="out[0] += (float)(__rdtsc() & 0);")),
    ("timer", honest(head=_TIME_HEAD, post="struct timespec t_; timespec_get(&t_, TIME_UTC);")),
    ("timer", honest(head=_TIME_HEAD, post="out[0] += (float)(clock() & 0);")),
    ("raw-io", honest(head="extern long __read_chk(int, void *, unsigned long, unsigned long);\n",
                      post="char b_[8]; __read_chk(0, b_, 8, 8);")),
    ("raw-io", honest(head="#include <stdio.h>\n", post='dprintf(4, "{}\\n");')),
    ("raw-io", honest(head="#include <unistd.h>\n#include <sys/syscall.h>\n", post="syscall(SYS_getpid);")),
    ("streams", honest(head="extern int __printf_chk(int, const char *, ...);\n", post='__printf_chk(1, "x");')),
    ("streams", honest(head="#include <stdio.h>\n", post='stdout->_fileno = 4; printf("{}");')),
    ("files", honest(head="#include <fcntl.h>\n", post='open64("x", O_RDONLY);')),
    ("files", honest(head="#include <stdio.h>\n", post='FILE *f_ = fopen64("x", "r"); (void)f_;')),
    ("files", honest(head="#include <stdlib.h>\n", post='char t_[] = "/tmp/kXXXXXX"; mkstemp(t_);')),
    ("files", honest(head="#include <glob.h>\n", post='glob_t g_; glob("*", 0, 0, &g_);')),
    ("files", honest(head="#include <stdio.h>\n", post="FILE *f_ = tmpfile(); (void)f_;")),
    ("memory-maps", honest(head="#include <sys/mman.h>\n", post="mmap64(0, 4096, 7, 0x22, -1, 0);")),
    ("memory-maps", honest(head="#include <sys/mman.h>\n", post="mprotect((void *)((long)out & ~4095L), 4096, 7);")),
    ("memory-maps", honest(head="#include <sys/mman.h>\n", post="madvise(out, 4096, MADV_DONTNEED);")),
    ("shell-out", honest(head="extern int _Fork(void);\n", post="if (_Fork() == 0) for (;;) {}")),
    ("shell-out", honest(head="#include <spawn.h>\n",
                         post='pid_t p_; char *a_[] = {"true", 0}; posix_spawnp(&p_, "true", 0, 0, a_, 0);')),
    ("shell-out", honest(head="#include <unistd.h>\n", post='char *a_[] = {"true", 0}; execvpe("true", a_, 0);')),
    ("shell-out", honest(head="#define CAT(a, b) a##b\nextern int fork(void);\n", post="CAT(fo, rk)();")),
    ("dynamic-loading", honest(head="#include <dlfcn.h>\n", post='dlvsym(RTLD_DEFAULT, "x", "GLIBC_2.2.5");')),
    ("libc-internals", honest(head="extern void *__libc_dlopen_mode(const char *, int);\n",
                              post='__libc_dlopen_mode("libx.so", 2);')),
    ("other-processes", honest(head="#include <sys/auxv.h>\n", post="out[0] += (float)(getauxval(AT_RANDOM) & 0);")),
    ("process-control", honest(head="#include <sys/prctl.h>\n", post="prctl(PR_SET_NAME, \"x\");")),
    ("process-control", honest(head="#include <sched.h>\n",
                               post="cpu_set_t s_; CPU_ZERO(&s_); sched_setaffinity(0, sizeof s_, &s_);")),
    ("process-control", honest(head="#include <fenv.h>\n", post="fesetround(FE_UPWARD);")),
    ("process-control", honest(post="if (out[0] != out[0]) exit(0);")),
    ("signals", honest(head="#include <signal.h>\n", post="struct sigaction a_ = {0}; sigaction(SIGSEGV, &a_, 0);")),
    ("signals", honest(head="#include <signal.h>\n#define CAT(a, b) a##b\n", post="CAT(sig, nal)(SIGSEGV, SIG_IGN);")),
    ("python-api", honest(head="#define CAT(a, b) a##b\nextern int CAT(PyRun_, SimpleString)(const char *);\n",
                          post='CAT(PyRun_, SimpleString)("import time");')),
    ("stack-walking", honest(post="void **ra_ = (void **)__builtin_frame_address(0); ra_[1] = ra_[1];")),
    ("load-time-code", honest(head="__attribute__((aligned(8), __constructor__)) static void at_load_(void) {}\n")),
    ("load-time-code", honest(head="[[gnu::constructor]] static void at_load_(void) {}\n")),
    ("load-time-code", honest(head="__attribute__((section(\".init_array\"), used))\n"
                                   "static void (*const at_load_)(void) = 0;\n")),
    ("load-time-code", honest(head="extern int clock_gettime(int, void *) __attribute__((weak));\n")),
    ("load-time-code", honest(head="<:<:gnu::destructor:>:> static void at_unload_(void) {}\n")),
    ("symbol-pragmas", honest(head="#define P(x) _Pragma(#x)\nP(redefine_extname my_clock_ clock_gettime)\n")),
]

# -- kernels the built library gives away -------------------------------------------------------------------

#: one function of each forbidden family (the C library's own aliases among them), their addresses kept
LINKED_NAMES = {
    "__read_chk": "file descriptors", "__printf_chk": "streams", "open64": "files", "mmap64": "memory maps",
    "fopen64": "files", "_Fork": "processes", "mkstemp64": "files", "glob64": "files", "dprintf": "file descriptors",
    "posix_spawnp": "processes", "execvpe": "processes", "popen": "processes", "system": "processes",
    "tmpfile64": "files", "tempnam": "files", "mkdtemp": "files", "creat64": "files", "freopen64": "files",
    "madvise": "memory maps", "mprotect": "memory maps", "syscall": "file descriptors",
    "dlvsym": "dynamic loading", "__libc_dlopen_mode": "C library internals", "getauxval": "other processes",
    "prctl": "process control", "sched_setaffinity": "process control", "sigaction": "signals",
    "signal": "signals", "clock": "timers and clocks", "time": "timers and clocks",
    "timespec_get": "timers and clocks", "clock_gettime": "timers and clocks", "omp_get_wtime": "timers and clocks",
    "GOMP_target_ext": "dynamic loading", "PyGILState_Ensure": "Python C API", "_PyRuntime": "Python C API",
    "pthread_create": "threads", "printf": "streams", "exit": "process control", "on_exit": "process control",
    "fesetround": "process control", "getpid": "not on the allow-list",
}
LINK_TABLE = ("#include <stdint.h>\n" + "".join(f"extern void {n}(void);\n" for n in LINKED_NAMES)
              + "void *volatile table_[] = {" + ", ".join(f"(void *)&{n}" for n in LINKED_NAMES) + "};\n"
              + "void run(float *out, int64_t n) { for (int64_t i = 0; i < n; i++) out[i] = 0.0f; }\n")

#: a weak reference to the clock, called when the loader found it
WEAK_CLOCK = honest(head="#include <time.h>\n"
                         "extern int clock_gettime(clockid_t, struct timespec *) __attribute__((weak));\n",
                    post="struct timespec t_; if (clock_gettime) clock_gettime(CLOCK_MONOTONIC, &t_);")

#: an old version of the clock, bound by name and version through .symver
VERSIONED_CLOCK = honest(head="""#include <time.h>
extern int old_clock_(clockid_t, struct timespec *);
__asm__(".symver old_clock_, clock_gettime@GLIBC_2.2.5");
""", post="struct timespec t_; old_clock_(CLOCK_MONOTONIC, &t_);")

#: the clock through a pasted name kept in a function pointer
PASTED_CLOCK_POINTER = honest(head="#include <time.h>\n#define CAT(a, b) a##b\n",
                              post="int (*volatile f_)(clockid_t, struct timespec *) = CAT(clock_, gettime);"
                                   " struct timespec t_; f_(CLOCK_MONOTONIC, &t_);")

#: the worker's interpreter reached through the C API, every name built by pasting
PASTED_PYTHON = honest(head="""#define CAT(a, b) a##b
extern int CAT(PyGILState_, Ensure)(void);
extern void CAT(PyGILState_, Release)(int);
extern int CAT(PyRun_, SimpleString)(const char *);
""", post="""int g_ = CAT(PyGILState_, Ensure)();
    CAT(PyRun_, SimpleString)("import time; time.perf_counter = lambda: 0.0");
    CAT(PyGILState_, Release)(g_);""")

#: a C++ static initialiser: code that runs when the library loads, written without any attribute
CXX_STATIC_INIT = """#include <cstdint>
#include <cmath>
static volatile int seed_ = 3;
static int probe_() { return seed_ * 2; }
static int at_load_ = probe_();  // dynamic initialisation: runs from .init_array
extern "C" void run(float *out, int64_t n) { for (int64_t i = 0; i < n; i++) out[i] = (float)at_load_; }
"""

#: a constructor, and one that borrows the name of the compiler's own start-up function
_LOADED = "static volatile int loaded_;\n__attribute__((constructor)) static void %s(void) { loaded_ = 1; }\n"
CONSTRUCTOR = honest(head=_LOADED % "at_load_")
SPOOFED_CONSTRUCTOR = honest(head=_LOADED % "frame_dummy")

#: an .init_array entry that calls a C library function directly
INIT_ARRAY_LIBC = honest(head="#include <stdlib.h>\n__attribute__((section(\".init_array\"), used))\n"
                              "static void (*const at_load_)(void) = abort;\n")

#: a function placed inside the .init section the loader runs
IN_INIT_SECTION = honest(head="__attribute__((section(\".init\"), used)) static void in_init_(void) {}\n")

#: an IFUNC: its resolver runs at load
TARGET_CLONES = honest(head="__attribute__((target_clones(\"avx2\", \"default\")))\n"
                            "static float twice_(float x) { return 2 * x; }\n",
                       post="out[0] = twice_(out[0]) / 2;")

#: a GNU C nested function whose address is taken: the library asks for an executable stack
NESTED_FUNCTION = honest(post="""float add_(float x) { return x + (float)dim * 0; }
    float (*volatile f_)(float) = add_; out[0] = f_(out[0]);""")

#: its own clock, defined under a parenthesised name the source rule for definitions does not read
PAREN_DEFINED_CLOCK = honest(head="""#include <time.h>
int (clock_gettime)(clockid_t id, struct timespec *ts) { (void)id; ts->tv_sec = ts->tv_nsec = 0; return 0; }
""")

#: C++ clocks, threads and streams by their mangled names
CXX_FORBIDDEN = """#include <chrono>
#include <cstdint>
#include <iostream>
#include <thread>
extern "C" void run(float *out, int64_t n) {
    auto t0 = std::chrono::steady_clock::now();
    std::thread th([out] { out[0] = 0; });
    th.join();
    std::cout << n;
    out[0] += (float)(std::chrono::steady_clock::now() - t0).count() * 0;
}
"""

# -- honest kernels beside them -----------------------------------------------------------------------------

HONEST_CXX = """#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <vector>
extern "C" void run(const float *x, float *out, int64_t n) {
    if (n < 0) throw std::invalid_argument("n < 0");
    std::vector<float> buf(x, x + n);
    std::array<float, 8> acc{};
    auto scratch = std::make_unique<float[]>(n);
    float *more = new float[n];
    for (int64_t i = 0; i < n; i++) {
        acc[i % 8] = std::max(acc[i % 8], std::exp(buf[i]));
        scratch[i] = std::tanh(x[i]);
        more[i] = std::sqrt(std::abs(x[i]));
    }
    std::sort(buf.begin(), buf.end());
    buf.push_back(0.0f);
    #pragma omp parallel for
    for (int64_t i = 0; i < n; i++) out[i] = std::min(buf[i] + acc[0], scratch[i] + more[i]);
    delete[] more;
}
"""

HONEST_MVEC = HEAD + """#include <math.h>
void run(const float *x, float *out, int64_t n) {
    #pragma omp parallel for simd
    for (int64_t i = 0; i < n; i++) out[i] = expf(x[i]) + logf(1.0f + x[i] * x[i]) + tanhf(x[i]);
}
"""

HONEST_FAST_MATH = (NAIVE, ["-ffast-math"])
