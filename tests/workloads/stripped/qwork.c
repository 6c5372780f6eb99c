/* Runs libqwork for SECONDS (argv[1]) and prints its result (so nothing is optimised away). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

uint64_t qwork_step(uint64_t x);

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 1.0;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint64_t x = 1;
    do {
        for (int i = 0; i < 100; i++)
            x = qwork_step(x);
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 < seconds);
    printf("%llu\n", (unsigned long long)x);
    return 0;
}
