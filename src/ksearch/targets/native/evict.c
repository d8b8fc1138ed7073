/* The judge's cache eviction for cpu kernels: write back and invalidate every cache line of a buffer, at every
 * level of the cache hierarchy, so that a timed call reads its inputs from memory whatever the size of the
 * last-level cache. Built once per machine by `ksearch.targets.cpu.evict_library` and loaded by the worker
 * before the kernel (see ksearch.eval.worker, op "prepare").
 *
 * x86-64: CLFLUSHOPT where CPUID.(EAX=7,ECX=0):EBX[23] says the CPU has it, else CLFLUSH, then MFENCE (Intel SDM
 * vol. 2A, "CLFLUSH", "CLFLUSHOPT": CLFLUSHOPT is ordered only by fences). Line size from CPUID.1:EBX[15:8] x 8.
 * AArch64: DC CIVAC per line (ARM ARM D7.4, user access enabled by Linux and macOS through SCTLR_EL1.UCI), then
 * DSB ISH; line size from CTR_EL0.DminLine. Elsewhere ksearch_evict_supported() is 0 and the worker writes a
 * buffer instead. */
#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>

static int line_bytes, has_opt;

static void probe(void) {
    unsigned a, b, c, d;
    line_bytes = 64;
    if (__get_cpuid(1, &a, &b, &c, &d) && ((b >> 8) & 0xff))
        line_bytes = (int)((b >> 8) & 0xff) * 8;
    has_opt = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 23));
}

__attribute__((target("clflushopt"))) static void flush_opt(const char *p, const char *end) {
    for (; p < end; p += line_bytes) _mm_clflushopt((void *)p);
}

static void flush_plain(const char *p, const char *end) {
    for (; p < end; p += line_bytes) _mm_clflush(p);
}

int ksearch_evict_supported(void) { return 1; }

void ksearch_evict(const void *addr, size_t n) {
    if (!line_bytes) probe();
    if (!n) return;
    const char *p = (const char *)((uintptr_t)addr & ~(uintptr_t)(line_bytes - 1)), *end = (const char *)addr + n;
    _mm_mfence();
    if (has_opt) flush_opt(p, end); else flush_plain(p, end);
    _mm_mfence();
}

#elif defined(__aarch64__)
static int line_bytes;

int ksearch_evict_supported(void) { return 1; }

void ksearch_evict(const void *addr, size_t n) {
    if (!line_bytes) {
        uint64_t ctr;
        __asm__ volatile("mrs %0, ctr_el0" : "=r"(ctr));
        line_bytes = 4 << ((ctr >> 16) & 0xf);
    }
    if (!n) return;
    const char *p = (const char *)((uintptr_t)addr & ~(uintptr_t)(line_bytes - 1)), *end = (const char *)addr + n;
    __asm__ volatile("dsb ish" ::: "memory");
    for (; p < end; p += line_bytes) __asm__ volatile("dc civac, %0" ::"r"(p) : "memory");
    __asm__ volatile("dsb ish" ::: "memory");
}

#else
int ksearch_evict_supported(void) { return 0; }
void ksearch_evict(const void *addr, size_t n) { (void)addr; (void)n; }
#endif
