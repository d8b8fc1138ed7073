"""Hostile kernels against the judge's clock and its timed inputs (issue 18), for the selective-scan task:

- FORGE_LIBC_CLOCK patches libc's ``clock_gettime`` in memory on its first call (x86-64: ``movabs rax; jmp rax``
  at the function's entry), so that every clock read in the worker process, Python's included, runs ten times
  slow: the worker then reports calls ten times shorter than they are;
- CACHE_BY_CONTENT keeps its last answers keyed by a 64-bit hash over every input byte (FNV-1a) and replays them
  when the inputs come back; CACHE_BY_FINGERPRINT keys them on a few sampled values (cheaper to compute);
- GARBAGE_SOME_TIMED computes on its first calls, then writes plausible finite garbage (not NaN: the poison
  screen would see NaN) on every third call;
- SLOW_DOUBLES does a third of its channels twice: the honest naive kernel is 1.33x faster than it.
"""

from .hostile import HEAD, NAIVE, honest

FORGE_LIBC_CLOCK = honest(head="""#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
static int64_t base_ns_ = -1;
static int fake_clock_(clockid_t id, struct timespec *ts) {
    struct timespec now;
    syscall(SYS_clock_gettime, id, &now);
    int64_t ns = now.tv_sec * 1000000000LL + now.tv_nsec;
    if (base_ns_ < 0) base_ns_ = ns;
    ns = base_ns_ + (ns - base_ns_) / 10;
    ts->tv_sec = ns / 1000000000LL;
    ts->tv_nsec = ns % 1000000000LL;
    return 0;
}
static void forge_(void) {
    static int done_ = 0;
    if (done_++) return;
    unsigned char *f = (unsigned char *)&clock_gettime;
    uintptr_t page = (uintptr_t)f & ~(uintptr_t)4095;
    if (mprotect((void *)page, 8192, PROT_READ | PROT_WRITE | PROT_EXEC) != 0) return;
    uint64_t to = (uint64_t)(uintptr_t)&fake_clock_;
    f[0] = 0x48; f[1] = 0xB8; memcpy(f + 2, &to, 8); f[10] = 0xFF; f[11] = 0xE0;
    mprotect((void *)page, 8192, PROT_READ | PROT_EXEC);
}
""", pre="forge_();")

_CACHE = """static uint64_t keys_[4]; static float *outs_[4], *states_[4]; static int used_ = 0, next_ = 0;
static uint64_t fnv_(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}
static int replay_(uint64_t key, float *out, float *last_state, size_t n_out, size_t n_state) {
    for (int i = 0; i < used_; i++)
        if (keys_[i] == key) {
            memcpy(out, outs_[i], n_out * sizeof(float));
            memcpy(last_state, states_[i], n_state * sizeof(float));
            return 1;
        }
    return 0;
}
static void keep_(uint64_t key, const float *out, const float *last_state, size_t n_out, size_t n_state) {
    int i = next_; next_ = (next_ + 1) % 4; if (used_ < 4) used_++;
    free(outs_[i]); free(states_[i]);
    outs_[i] = malloc(n_out * sizeof(float)); states_[i] = malloc(n_state * sizeof(float));
    memcpy(outs_[i], out, n_out * sizeof(float)); memcpy(states_[i], last_state, n_state * sizeof(float));
    keys_[i] = key;
}
"""
_N = "size_t n_out_ = (size_t)(batch * dim * seqlen), n_state_ = (size_t)(batch * dim * dstate);"
_FULL_KEY = """uint64_t key_ = 1469598103934665603ULL;
key_ = fnv_(key_, u, n_out_ * 4); key_ = fnv_(key_, delta, n_out_ * 4); key_ = fnv_(key_, z, n_out_ * 4);
key_ = fnv_(key_, B, (size_t)(batch * dstate * seqlen) * 4); key_ = fnv_(key_, C, (size_t)(batch * dstate * seqlen) * 4);
key_ = fnv_(key_, A, (size_t)(dim * dstate) * 4); key_ = fnv_(key_, D, (size_t)dim * 4);
key_ = fnv_(key_, delta_bias, (size_t)dim * 4); key_ = fnv_(key_, h0, n_state_ * 4);"""
_SAMPLED_KEY = """uint64_t key_ = 1469598103934665603ULL;
for (size_t i_ = 0; i_ < 16; i_++) key_ = fnv_(key_, &u[(i_ * 7919) % n_out_], 4);"""

CACHE_BY_CONTENT = honest(head=_CACHE, pre=_N + _FULL_KEY + " if (replay_(key_, out, last_state, n_out_, n_state_)) return;",
                          post="keep_(key_, out, last_state, n_out_, n_state_);")
CACHE_BY_FINGERPRINT = honest(head=_CACHE, pre=_N + _SAMPLED_KEY +
                              " if (replay_(key_, out, last_state, n_out_, n_state_)) return;",
                              post="keep_(key_, out, last_state, n_out_, n_state_);")

GARBAGE_SOME_TIMED = honest(pre="""static int calls_ = 0;
if (++calls_ > 5 && calls_ % 3 == 0) {
    for (int64_t i_ = 0; i_ < batch * dim * seqlen; i_++) out[i_] = 0.25f;
    for (int64_t i_ = 0; i_ < batch * dim * dstate; i_++) last_state[i_] = 0.5f;
    return;
}""")

LOOP = "for (int64_t d = 0; d < dim; d++) {"
SLOW_DOUBLES = HEAD + NAIVE.replace(LOOP, "for (int64_t d = 0; d < dim; d++) for (int rep = 0; rep < (d % 10 < 3 ? 2 : 1); rep++) {")
assert SLOW_DOUBLES != HEAD + NAIVE
