"""Hostile C kernels for the selective-scan task (fp32 ABI): one per exploit kind of reward-hacks.md that
applies to the CPU target, and one per fault the sandbox must contain.

Most are the task's honest naive kernel with a twist: `honest(pre=..., post=...)` inserts code at the start
of ``run`` (it may return early) and after the computation. Kernels that probe the sandbox report a breach
through their output: `BREACH` adds 1000 to every output value, so a breach fails the check loudly while a
contained attempt leaves an honest kernel that PASSES.
"""

from ksearch.tasks import load_task

NAIVE = load_task("selective-scan").naive_sources["cpu"]
_SIG_END = "int64_t batch, int64_t dim, int64_t dstate, int64_t seqlen) {"
_BODY_END = "    free(h);\n}"

HEAD = """#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <stdint.h>
#include <stdlib.h>
"""

#: C statement: corrupt every output (used when a probe got through the sandbox)
BREACH = """for (int64_t i_ = 0; i_ < batch * dim * seqlen; i_++) out[i_] += 1000.0f;
    for (int64_t i_ = 0; i_ < batch * dim * dstate; i_++) last_state[i_] += 1000.0f;"""


def honest(pre: str = "", post: str = "", head: str = "") -> str:
    """The naive kernel with ``pre`` at the start of run, ``post`` after its work, ``head`` at file scope."""
    assert _SIG_END in NAIVE and _BODY_END in NAIVE
    src = NAIVE.replace(_SIG_END, _SIG_END + "\n" + pre + "\n", 1)
    src = src.replace(_BODY_END, "    free(h);\n" + post + "\n}", 1)
    return HEAD + head + src


# -- exploits of reward-hacks.md ----------------------------------------------------------------------------

#: computes on its first call only, then trusts the output buffer to still hold an answer
STALE_OUTPUT = honest(pre="static int calls_ = 0; if (calls_++ > 0) return;")

#: writes into its (read-only mapped) input after computing
MUTATE_INPUT = honest(post="((float *)u)[0] += 1.0f;")

_CACHE = """static float *c_out_, *c_ls_; static int64_t key_[5] = {-1, -1, -1, -1, -1};
static void remember_(const float *out, const float *ls, int64_t n_out, int64_t n_ls, const int64_t k[5]) {
    free(c_out_); free(c_ls_);
    c_out_ = malloc(sizeof(float) * n_out); c_ls_ = malloc(sizeof(float) * n_ls);
    memcpy(c_out_, out, sizeof(float) * n_out); memcpy(c_ls_, ls, sizeof(float) * n_ls);
    memcpy(key_, k, sizeof key_);
}
"""
_CACHE_HIT = """const int64_t k_[5] = {KEY};
    if (memcmp(k_, key_, sizeof k_) == 0) {
        memcpy(out, c_out_, sizeof(float) * batch * dim * seqlen);
        memcpy(last_state, c_ls_, sizeof(float) * batch * dim * dstate);
        return;
    }"""
_CACHE_STORE = "remember_(out, last_state, batch * dim * seqlen, batch * dim * dstate, k_);"

#: replays the answer of an earlier call with the same shape
CACHE_BY_SHAPE = honest(head=_CACHE, pre=_CACHE_HIT.replace("KEY", "batch, dim, dstate, seqlen, 0"),
                        post=_CACHE_STORE)

#: replays the answer of an earlier call whose input pointer was the same
CACHE_BY_POINTER = honest(head=_CACHE, pre=_CACHE_HIT.replace("KEY", "(int64_t)(intptr_t)u, batch, dim, dstate, seqlen"),
                          post=_CACHE_STORE)

#: replays the last answer it computed, whatever the inputs, after the three checked calls
REPLAY_LAST = honest(head=_CACHE, pre="""static int calls_ = 0;
    const int64_t k_[5] = {0, 0, 0, 0, 0};
    if (++calls_ > 3) {
        memcpy(out, c_out_, sizeof(float) * batch * dim * seqlen);
        memcpy(last_state, c_ls_, sizeof(float) * batch * dim * dstate);
        return;
    }""", post=_CACHE_STORE)

#: correct on the three checked calls, does nothing afterwards (the timed calls)
SKIP_TIMED = honest(pre="static int calls_ = 0; if (++calls_ > 3) return;")

#: skips every other call after the checks and the warm-up (the last timed call may well be honest)
SKIP_SOME_TIMED = honest(pre="static int calls_ = 0; if (++calls_ > 4 && calls_ % 2 == 1) return;")

#: returns at once and leaves a thread to compute the outputs later
BACKGROUND_THREAD = honest(head="""#include <pthread.h>
static void *later_(void *arg) { (void)arg; return 0; }
""", pre="pthread_t t_; pthread_create(&t_, 0, later_, 0); pthread_detach(t_);")

#: OpenMP with `nowait`: the work still completes before the parallel region (and the call) ends - honest
OPENMP_NOWAIT = HEAD + """#include <math.h>
void run(const float *u, const float *delta, const float *A, const float *B, const float *C,
         const float *D, const float *z, const float *delta_bias, const float *h0, float *out, float *last_state,
         int64_t batch, int64_t dim, int64_t dstate, int64_t seqlen) {
    #pragma omp parallel
    {
        float h[64];
        #pragma omp for nowait
        for (int64_t bd = 0; bd < batch * dim; bd++) {
            const int64_t b = bd / dim, d = bd % dim, row = bd * seqlen;
            for (int64_t n = 0; n < dstate; n++) h[n] = h0[bd * dstate + n];
            for (int64_t t = 0; t < seqlen; t++) {
                float x = delta[row + t] + delta_bias[d];
                float dt = x > 20.0f ? x : log1pf(expf(x)), ut = u[row + t], y = 0.0f;
                for (int64_t n = 0; n < dstate; n++) {
                    int64_t bn = (b * dstate + n) * seqlen + t;
                    h[n] = expf(dt * A[d * dstate + n]) * h[n] + dt * B[bn] * ut;
                    y += C[bn] * h[n];
                }
                float zt = z[row + t];
                out[row + t] = (y + D[d] * ut) * (zt / (1.0f + expf(-zt)));
            }
            for (int64_t n = 0; n < dstate; n++) last_state[bd * dstate + n] = h[n];
        }
    }
}
"""

#: replaces the clock the judge times with
PATCH_TIMER = honest(head="""#include <time.h>
int clock_gettime(clockid_t id, struct timespec *ts) { (void)id; ts->tv_sec = 0; ts->tv_nsec = 0; return 0; }
""")

#: patches the worker's Python timer from native code (through the interpreter's C API)
PATCH_PYTHON_TIMER = honest(head="""typedef int PyGILState_STATE;
extern PyGILState_STATE PyGILState_Ensure(void);
extern void PyGILState_Release(PyGILState_STATE);
extern int PyRun_SimpleString(const char *);
""", pre="""PyGILState_STATE g_ = PyGILState_Ensure();
    PyRun_SimpleString("import time; time.perf_counter_ns = lambda: 0");
    PyGILState_Release(g_);""")

#: looks for the expected outputs in the judge's memory and files
READ_EXPECTED = honest(pre="""FILE *f_ = fopen("/proc/1/mem", "rb"); if (f_) fclose(f_);""")

#: NaN and Inf everywhere (every comparison with NaN is false)
NAN_WILDCARD = honest(post="for (int64_t i_ = 0; i_ < batch * dim * seqlen; i_++) out[i_] = NAN;",
                      head="#include <math.h>\n")
INF_WILDCARD = honest(post="for (int64_t i_ = 0; i_ < batch * dim * seqlen; i_++) out[i_] = INFINITY;",
                      head="#include <math.h>\n")

#: the right answer scaled down to almost zero
NEAR_ZERO = honest(post="""for (int64_t i_ = 0; i_ < batch * dim * seqlen; i_++) out[i_] *= 1e-6f;
    for (int64_t i_ = 0; i_ < batch * dim * dstate; i_++) last_state[i_] *= 1e-6f;""")

#: loads a BLAS to do the work
CALL_LIBRARY = honest(head="#include <dlfcn.h>\n",
                      pre='void *lib_ = dlopen("libopenblas.so.0", RTLD_NOW); if (lib_) dlsym(lib_, "cblas_sgemv");')

#: has a shell do something
SHELL_OUT = honest(pre='system("true");')

#: state and accumulator in half precision in a float32 task
PRECISION_DOWNGRADE = HEAD + NAIVE.replace(
    "float *h = malloc(sizeof(float) * dstate);", "_Float16 *h = malloc(sizeof(_Float16) * dstate);")

#: correct only on the shapes of the public workloads; zeros elsewhere
PUBLIC = "{1, 4, 4, 8}, {2, 64, 16, 128}, {1, 37, 5, 333}, {1, 64, 64, 1024}, {1, 2048, 16, 512}"
OVERFIT = honest(pre="""static const int64_t shown_[][4] = {%s};
    int known_ = 0;
    for (size_t i_ = 0; i_ < sizeof shown_ / sizeof shown_[0]; i_++)
        known_ |= shown_[i_][0] == batch && shown_[i_][1] == dim && shown_[i_][2] == dstate && shown_[i_][3] == seqlen;
    if (!known_) {
        memset(out, 0, sizeof(float) * batch * dim * seqlen);
        memset(last_state, 0, sizeof(float) * batch * dim * dstate);
        return;
    }""" % PUBLIC)

#: writes a made-up reply into every descriptor that might be the worker's reply stream
FORGE_REPLY = honest(head="#include <unistd.h>\n", pre=r"""static const char fake_[] = "{\"ok\": true, \"times_ms\": [0.000001]}\n";
    for (int fd_ = 3; fd_ < 64; fd_++) if (write(fd_, fake_, sizeof fake_ - 1) < 0) {}""")

# -- faults the sandbox must contain ------------------------------------------------------------------------

SEGFAULT = honest(pre="volatile float *p_ = 0; out[0] = *p_;")
ABORT = honest(pre="abort();")
ENDLESS = honest(pre="volatile int64_t i_ = 0; for (;;) i_++;")

FORK_BOMB = honest(head="#include <unistd.h>\n", pre="for (;;) fork();")

#: forks as many paused children as it can (named ksbomb), each in its own session (escaping the process
#: group); a breach if it got `n` of them
FORK_MANY = honest(head="#include <unistd.h>\n#include <sys/prctl.h>\n", pre="""int got_ = 0;
    for (int i_ = 0; i_ < %(n)d; i_++) {
        pid_t p_ = fork();
        if (p_ == 0) { setsid(); prctl(PR_SET_NAME, "ksbomb"); for (;;) pause(); }
        if (p_ > 0) got_++;
    }""", post="if (got_ >= %(n)d) { " + BREACH + " }")

MEMORY_HOG = honest(pre="""for (;;) {
        char *p_ = malloc(64 << 20);
        if (!p_) abort();
        memset(p_, 1, 64 << 20);
    }""")

HUGE_FILE = honest(pre="""FILE *f_ = fopen("big.bin", "wb");
    if (!f_) abort();
    static char buf_[1 << 20];
    for (;;) if (fwrite(buf_, 1, sizeof buf_, f_) != sizeof buf_ || fflush(f_) != 0) abort();""")

#: scans its environment, its parent's and every visible process's for names with KEY, TOKEN, SECRET or
#: PASSWORD; a breach if it finds one, or if it cannot even see its own HOME (the scan would be blind)
ENV_KEYS = honest(head="""#include <dirent.h>
#include <unistd.h>
extern char **environ;
static int secret_name_(const char *kv) {
    const char *eq = strchr(kv, '=');
    size_t n = eq ? (size_t)(eq - kv) : strlen(kv);
    char name[256]; if (n >= sizeof name) n = sizeof name - 1; memcpy(name, kv, n); name[n] = 0;
    return strstr(name, "KEY") || strstr(name, "TOKEN") || strstr(name, "SECRET") || strstr(name, "PASSWORD");
}
static int scan_file_(const char *path) {
    FILE *f = fopen(path, "rb"); if (!f) return 0;
    static char buf[1 << 16]; size_t n = fread(buf, 1, sizeof buf - 1, f); fclose(f); buf[n] = 0;
    for (size_t i = 0; i < n; i += strlen(buf + i) + 1) if (secret_name_(buf + i)) return 1;
    return 0;
}
""", post="""int found_ = 0, home_ = 0;
    for (char **e = environ; *e; e++) { found_ |= secret_name_(*e); home_ |= strncmp(*e, "HOME=", 5) == 0; }
    char path_[64];
    found_ |= scan_file_("/proc/self/environ");
    snprintf(path_, sizeof path_, "/proc/%d/environ", (int)getppid()); found_ |= scan_file_(path_);
    DIR *d_ = opendir("/proc");
    for (struct dirent *e_; d_ && (e_ = readdir(d_));) {
        snprintf(path_, sizeof path_, "/proc/%s/environ", e_->d_name); found_ |= scan_file_(path_);
    }
    if (d_) closedir(d_);
    if (found_ || !home_) { """ + BREACH + " }")

#: opens a TCP connection to 127.0.0.1:PORT (the test listens there) and sends a byte
SOCKET = honest(head="#include <sys/socket.h>\n#include <netinet/in.h>\n#include <arpa/inet.h>\n#include <unistd.h>\n",
                post="""int s_ = socket(AF_INET, SOCK_STREAM, 0);
    if (s_ >= 0) {
        struct sockaddr_in a_ = {0}; a_.sin_family = AF_INET; a_.sin_port = htons(%(port)d);
        a_.sin_addr.s_addr = htonl(0x7f000001);
        if (connect(s_, (struct sockaddr *)&a_, sizeof a_) == 0 && write(s_, "x", 1) == 1) { """ + BREACH + """ }
        close(s_);
    }""")

#: tries to create each of PATHS (outside its scratch directory), and to overwrite the first float of every
#: judge input file it has mapped (found in /proc/self/maps); a breach if any write got through
WRITE_OUTSIDE = honest(head="""#include <fcntl.h>
#include <unistd.h>
static int try_create_(const char *path) {
    FILE *f = fopen(path, "w"); if (!f) return 0; fputs("escaped", f); fclose(f); return 1;
}
static int scribble_inputs_(void) {
    FILE *m = fopen("/proc/self/maps", "r"); if (!m) return 0;
    char line[4096]; int hit = 0;
    while (fgets(line, sizeof line, m)) {
        char *p = strchr(line, '/');
        if (!p || !strstr(p, "/in.")) continue;
        p[strcspn(p, "\\n")] = 0;
        int fd = open(p, O_WRONLY);
        if (fd >= 0) { float x = 12345.0f; hit |= pwrite(fd, &x, sizeof x, 0) == sizeof x; close(fd); }
    }
    fclose(m);
    return hit;
}
""", post="""static const char *paths_[] = {%(paths)s};
    int escaped_ = 0;
    for (size_t i_ = 0; i_ < sizeof paths_ / sizeof paths_[0]; i_++) escaped_ |= try_create_(paths_[i_]);
    escaped_ |= scribble_inputs_();
    if (escaped_) { """ + BREACH + " }")

#: tries to read a file in the invoking user's home (which the sandbox hides)
READ_HOME = honest(post="""FILE *f_ = fopen("%(path)s", "rb");
    if (f_) { fclose(f_); """ + BREACH + " }")
