/*
 * phases.c - four phase functions, each a different integer loop, run round-robin in ~2 ms slices
 * of thread CPU time for SECONDS of wall time; the ground truth for naming a program whose file is
 * gone or lives only in its own mount namespace (tests/test_mapped_files.py: phases.toml names each
 * phase to one category, as a user would, so an unnamed phase shows as Uncategorized).
 * It prints its pid (as the host sees it: getpid() inside a pid namespace gives the namespace's, so
 * the test reads it from /proc instead) and, with a third argument, writes a perf map file
 * /tmp/perf-<its pid>.map naming its own phase_jit region, as a JIT does.
 * Build: gcc -O2 -g -fno-omit-frame-pointer -Wall -Wextra -Wl,--build-id=0x<hex> -o phases phases.c
 * Usage: phases SECONDS [--perf-map]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile uint64_t sink;

static long long now_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

#define SLICE_NS 2000000LL

/* each phase: its own loop until its slice of thread CPU time is spent; noinline so every sample of
 * its work has the phase as leaf (or, with a clock read, as caller) */
#define DEFINE_PHASE(name, step)                                              \
    __attribute__((noinline, noipa)) void name(void)                         \
    {                                                                         \
        long long end = now_ns(CLOCK_THREAD_CPUTIME_ID) + SLICE_NS;           \
        uint64_t x = sink + 1;                                                \
        do {                                                                  \
            for (int i = 0; i < 4096; i++) { step; }                          \
        } while (now_ns(CLOCK_THREAD_CPUTIME_ID) < end);                      \
        sink = x;                                                             \
    }

DEFINE_PHASE(qprof_phase_seal, x = (x ^ (x >> 31)) * 0xbf58476d1ce4e5b9ULL)
DEFINE_PHASE(qprof_phase_frame, x = (x << 7 | x >> 57) + 0x9e3779b97f4a7c15ULL)
DEFINE_PHASE(qprof_phase_send, x = x * 6364136223846793005ULL + 1442695040888963407ULL)
DEFINE_PHASE(qprof_phase_log, x ^= x << 13; x ^= x >> 7; x ^= x << 17)

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: phases SECONDS [--perf-map]\n");
        return 2;
    }
    double seconds = atof(argv[1]);
    if (argc > 2 && strcmp(argv[2], "--perf-map") == 0) {
        char path[64];
        snprintf(path, sizeof path, "/tmp/perf-%d.map", (int)getpid());
        FILE *f = fopen(path, "w");
        if (f == NULL) {
            perror(path);
            return 1;
        }
        fprintf(f, "%lx 100 qprof_phase_jit\n", (unsigned long)(uintptr_t)&qprof_phase_seal);
        fclose(f);
    }
    printf("%d\n", (int)getpid());
    fflush(stdout);
    long long end = now_ns(CLOCK_MONOTONIC) + (long long)(seconds * 1e9);
    while (now_ns(CLOCK_MONOTONIC) < end) {
        qprof_phase_seal();
        qprof_phase_frame();
        qprof_phase_send();
        qprof_phase_log();
    }
    return 0;
}
