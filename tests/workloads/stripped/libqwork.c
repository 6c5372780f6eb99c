/* A library with internal (static) functions, stripped like a distribution's: what qprof's symbol
 * lookup must name (tests/test_debuginfo.py). Each function burns a known share of the CPU. */
#include <stdint.h>

static uint64_t mix_rounds(uint64_t x, int n) __attribute__((noinline));
static uint64_t table_walk(uint64_t x, int n) __attribute__((noinline));

static uint64_t mix_rounds(uint64_t x, int n) {
    for (int i = 0; i < n; i++) {
        x ^= x >> 33;
        x *= 0xff51afd7ed558ccdULL;
        x ^= x >> 29;
    }
    return x;
}

static uint64_t table_walk(uint64_t x, int n) {
    static uint64_t t[4096];
    for (int i = 0; i < n; i++) {
        uint64_t j = x & 4095;
        t[j] += x;
        x = t[(j * 7 + 1) & 4095] + 0x9e3779b97f4a7c15ULL;
    }
    return x;
}

/* the one exported function: calls the internal ones, two parts mixing to one part walking */
uint64_t qwork_step(uint64_t x) {
    x = mix_rounds(x, 2000);
    x = table_walk(x, 1000);
    return x;
}
