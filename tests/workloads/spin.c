/*
 * spin.c - burns CPU in one named function for SECONDS (a whole number) of process CPU time,
 * then exits 0. Freestanding (no libc: raw system calls), static, with frame pointers in all
 * its code, so qprof unwinds it with frame pointers; the exec test starts it through a shell
 * (dynamic, no frame pointers: DWARF) that execs it after qprof attached.
 * Build: gcc -O0 -fno-omit-frame-pointer -static -nostdlib -o spin spin.c (-O0: every function
 *        sets up its frame first, where a reader of the binary looks for it)
 * Usage: spin SECONDS
 */
typedef unsigned long u64;

struct timespec_k { long sec, nsec; };

static long sys2(long n, long a, long b)
{
    long r;
    __asm__ volatile ("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b) : "rcx", "r11", "memory");
    return r;
}

volatile u64 qprof_spin_sink;

/* a chain of mixing steps in functions of their own, each calling the next: enough functions
 * with a frame set up for a reader of the binary to see that it keeps frame pointers */
__attribute__((noinline, noipa)) static u64 mix_c(u64 x) { return x ^ (x >> 33) ^ 0x9e3779b97f4a7c15ULL; }
__attribute__((noinline, noipa)) static u64 mix_b(u64 x) { x ^= x >> 27; return mix_c(x * 0x94d049bb133111ebULL) + 1; }
__attribute__((noinline, noipa)) static u64 mix_a(u64 x) { x ^= x >> 31; return mix_b(x * 0xbf58476d1ce4e5b9ULL) + 1; }

__attribute__((noinline, noipa, used))
u64 qprof_spin_work(u64 x, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        x ^= x >> 31;
        x *= 0xbf58476d1ce4e5b9ULL;
        x ^= x >> 27;
    }
    return mix_a(x);
}

__attribute__((noinline, noipa))
static long parse_seconds(const char *p)
{
    long secs = 0;

    for (; *p >= '0' && *p <= '9'; p++)
        secs = secs * 10 + (*p - '0');
    return secs;
}

__attribute__((noinline, used))
int spin_main(long argc, char **argv)
{
    long secs = 1;
    struct timespec_k ts;
    u64 x = 1;

    if (argc > 1)
        secs = parse_seconds(argv[1]);
    for (;;) {
        x = qprof_spin_work(x, 1u << 16);
        qprof_spin_sink = x;
        sys2(228 /* clock_gettime */, 2 /* CLOCK_PROCESS_CPUTIME_ID */, (long)&ts);
        if (ts.sec >= secs)
            return 0;
    }
}

__attribute__((noreturn, used))
void spin_start(long *sp)
{
    long rc = spin_main(sp[0], (char **)(sp + 1));

    for (;;)
        sys2(231 /* exit_group */, rc, 0);
}

/* the kernel enters at _start with the stack pointer at argc: hand it to C, aligned */
__asm__(".globl _start\n_start:\n\txor %rbp, %rbp\n\tmov %rsp, %rdi\n\tand $-16, %rsp\n\tcall spin_start\n");
