/*
 * waits.c - ground-truth workload for qprof's wall-clock (off-CPU) accounting.
 *
 * Named threads of one process wait in known kinds of blocking calls and
 * measure every wait themselves, with CLOCK_MONOTONIC around each call:
 *
 *   w-net     blocks in recvfrom() on a UDP socket bound to 127.0.0.1; a
 *             separate process, w-feeder (forked), sends it one datagram
 *             every 5 ms, so the wakeup comes through the network path;
 *             after each datagram ~1 ms of computation      -> "network"
 *   w-timer   ~2 ms of computation, then clock_nanosleep() of 3 ms; every
 *             10th wait is an epoll_wait() with a 4 ms timeout on an empty
 *             epoll set instead                               -> "timer"
 *   w-cond    pthread_cond_wait() until w-signal signals, then ~1 ms of
 *             computation (the whole lock / wait / unlock is measured)
 *                                                            -> "thread"
 *   w-signal  ~1 ms of computation, signals w-cond, then clock_nanosleep()
 *             to its next 7 ms tick                           -> "timer"
 *   w-disk    pread() of 64 KiB at a random 64 KiB-aligned offset of a
 *             64 MiB file in WORKDIR (written and fsynced before the run,
 *             not measured), with O_DIRECT, or, where O_DIRECT is refused,
 *             after posix_fadvise(DONTNEED) of the range      -> "disk"
 *             in bursts of 8 reads, with a 2 ms clock_nanosleep() between
 *             bursts (the host's disk may be shared)          -> "timer"
 *
 * With --busy, one forked process per online CPU, w-hog, spins for the whole
 * run, so the threads also wait for a CPU (run-queue time).
 *
 * "Computation" is waits_compute() (integer mixing, no calls) until the
 * thread's CPU clock (CLOCK_THREAD_CPUTIME_ID) has advanced by the amount.
 *
 * A thread's wall time inside a blocking call is not all off-CPU: it includes
 * the CPU of the system call and the run-queue wait after the wakeup (waiting
 * for a CPU; large with --busy).  So each thread also reads its thread CPU
 * clock and its /proc/self/task/TID/schedstat (field 1: on-CPU ns, field 2:
 * run-queue wait ns) before and after every blocking call, and per kind
 *
 *   off_cpu = in_call - in_call_cpu - in_call_runqueue
 *
 * is the time it was blocked (sleeping, not runnable) in those calls.  Over a
 * thread's window (its start to its end):
 *
 *   window = cpu + schedstat_runqueue + sum(off_cpu) + residual
 *
 * where residual is off-CPU time outside the measured calls (page faults,
 * the odd futex) and skew between the clocks; it stays well under 1% of the
 * window (-0.35% at most seen, w-disk's).  The simpler cpu + runqueue +
 * sum(in_call) counts the calls' CPU and after-wakeup run-queue time twice:
 * ~1% for most threads on a quiet host, 15-20% for w-disk, whose preads are
 * a third CPU and run-queue wait, and up to ~12% with --busy.
 *
 * The kernel's CPU clock and schedstat split a thread's time between on a CPU
 * and run-queue wait where the scheduler's clock was last read, and a wakeup
 * that preempts the running task skips that read (rq_clock_skip_update): the
 * woken thread is charged on-CPU from its wakeup, not from its switch-in, and
 * its run-queue wait is 0.  Beside a busy process per CPU nearly every wakeup
 * preempts (13,500 of 14,400 of w-disk's in 5 s, 2-4 us each: 0.8% of its
 * window, more under a profiler).  So each thread also counts its own
 * task-clock (perf_event_open, PERF_COUNT_SW_TASK_CLOCK), which perf stops and
 * starts at the context switches themselves; the time the thread wanted a
 * CPU, cpu + schedstat_runqueue, is split at it:
 *
 *   on a CPU = task_clock,   runnable = cpu + schedstat_runqueue - task_clock
 *
 * The task-clock (sched_clock) also counts what the host took from the vCPU
 * while the thread ran (steal); the CPU clock leaves it out, so the formulas
 * above move steal from on a CPU into the calls' off-CPU time.  The host's
 * share lands mostly in w-disk's reads, right after each is submitted (CI:
 * 165 ms in 5 s).  So every call also reads the task-clock around it
 * ("in_call_task_clock_s"): a call's task-clock exceeds its CPU clock by its
 * steal less its preempting wakeup's time, and a consumer can take the larger
 * of the two per kind.
 *
 * The pid is printed on stdout (and flushed) first thing, so a profiler can
 * attach while the disk file is written; all threads then start together and
 * run for SECONDS of wall time (or until SIGTERM/SIGINT), and OUT.json is
 * written atomically (temp file + rename):
 *
 *   {"pid": n, "seconds": s, "busy": bool, "cpus": n, "feeder_pid": n,
 *    "hog_pids": [n, ...], "disk_mode": "O_DIRECT" | "fadvise",
 *    "disk_reads": n, "disk_read_off_cpu_us": mean, "disk_note": str | null,
 *    "threads": {"w-net": {"tid": n, "window_s": s, "cpu_s": s,
 *                          "schedstat_on_cpu_s": s, "schedstat_runqueue_s": s,
 *                          "task_clock_s": s,
 *                          "in_call_s": {"network": s},
 *                          "in_call_cpu_s": {"network": s},
 *                          "in_call_runqueue_s": {"network": s},
 *                          "in_call_task_clock_s": {"network": s},
 *                          "off_cpu_s": {"network": s},
 *                          "residual_s": s, "calls": n,
 *                          "calls_by_function": {"recvfrom": n}},
 *                "w-timer": ..., "w-cond": ..., "w-signal": ..., "w-disk": ...}}
 *
 * Kinds per thread: w-net network; w-timer and w-signal timer; w-cond thread;
 * w-disk disk and timer.  disk_note is set (and printed on stderr) when the disk's
 * waits are too short to show (mean off-CPU time per read under 20 us, or
 * under 2% of w-disk's window in all).
 *
 * QPROF_WAITS_NO_DIRECT=1 skips O_DIRECT (to try the fadvise fallback).
 *
 * Build: gcc -O2 -g -fno-omit-frame-pointer -Wall -Wextra -pthread \
 *            -o waits waits.c
 * Usage: waits SECONDS OUT.json WORKDIR [--busy]
 * WORKDIR must be on a real block device for the disk waits (not tmpfs).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <linux/perf_event.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- parameters -------------------------------------------------------- */

#define MS                  1000000LL
#define FEED_PERIOD_NS      (5 * MS)     /* w-feeder: one datagram per period */
#define NET_WORK_NS         (1 * MS)     /* w-net: computation per datagram */
#define TIMER_WORK_NS       (2 * MS)     /* w-timer: computation per round */
#define TIMER_SLEEP_NS      (3 * MS)     /* w-timer: clock_nanosleep */
#define TIMER_EPOLL_MS      4            /* w-timer: epoll_wait timeout ... */
#define TIMER_EPOLL_EVERY   10           /* ... every 10th wait */
#define SIGNAL_PERIOD_NS    (7 * MS)     /* w-signal: one signal per period */
#define SIGNAL_WORK_NS      (1 * MS)     /* w-signal: computation before it */
#define COND_WORK_NS        (1 * MS)     /* w-cond: computation per wakeup */
#define DISK_BURST          8            /* w-disk: reads back to back, then ... */
#define DISK_PAUSE_NS       (2 * MS)     /* ... a pause (the host's disk is shared) */
#define DISK_FILE_SIZE      (64LL << 20)
#define DISK_CHUNK          (64 << 10)
#define DISK_NOTE_US        20.0         /* mean off-CPU per read below: too fast */
#define DISK_NOTE_SHARE     0.02         /* ... or all reads' off-CPU below this share */
#define RCV_TIMEOUT_US      100000       /* w-net: don't hang if w-feeder dies */

enum kind { K_NETWORK, K_TIMER, K_THREAD, K_DISK, NKINDS };
static const char *const kind_name[NKINDS] = { "network", "timer", "thread", "disk" };

enum func { F_RECVFROM, F_NANOSLEEP, F_EPOLL, F_CONDWAIT, F_PREAD, NFUNCS };
static const char *const func_name[NFUNCS] = {
    "recvfrom", "clock_nanosleep", "epoll_wait", "pthread_cond_wait", "pread",
};

/* ---- state ------------------------------------------------------------- */

struct tstat {
    const char *name;
    void *(*body)(void *);
    pthread_t thread;
    pid_t tid;
    int sched_fd, task_clock_fd;
    unsigned kinds;                 /* bit per kind it waits in */
    long long mono0, mono1, cpu0, cpu1, ss_cpu0, ss_cpu1, ss_rq0, ss_rq1, tc0, tc1;
    long long in_call[NKINDS], in_call_cpu[NKINDS], in_call_rq[NKINDS], in_call_tc[NKINDS];
    unsigned long long calls, fcalls[NFUNCS];
};

enum { T_NET, T_TIMER, T_COND, T_SIGNAL, T_DISK, NTHREADS };

static void *net_main(void *);
static void *timer_main(void *);
static void *cond_main(void *);
static void *signal_main(void *);
static void *disk_main(void *);

static struct tstat threads[NTHREADS] = {
    [T_NET]    = { .name = "w-net",    .body = net_main,    .kinds = 1u << K_NETWORK },
    [T_TIMER]  = { .name = "w-timer",  .body = timer_main,  .kinds = 1u << K_TIMER },
    [T_COND]   = { .name = "w-cond",   .body = cond_main,   .kinds = 1u << K_THREAD },
    [T_SIGNAL] = { .name = "w-signal", .body = signal_main, .kinds = 1u << K_TIMER },
    [T_DISK]   = { .name = "w-disk",   .body = disk_main,   .kinds = 1u << K_DISK | 1u << K_TIMER },
};

static volatile sig_atomic_t stop_requested;
static pthread_barrier_t start_barrier;
static long long deadline_ns;       /* CLOCK_MONOTONIC; set before the barrier */

static int net_fd = -1;
static struct sockaddr_in net_addr;

static pthread_mutex_t cond_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond_cv = PTHREAD_COND_INITIALIZER;
static unsigned long long cond_seq;  /* signals sent */
static int signal_done;

static int disk_fd = -1;
static int disk_direct;
static char disk_path[PATH_MAX];
static unsigned char *disk_buf;

static pid_t feeder_pid = -1;
static pid_t hog_pids[1024];
static int nhogs;

volatile uint64_t waits_sink;

/* ---- helpers ----------------------------------------------------------- */

static const char *prog = "waits";
static char json_tmp[PATH_MAX];
static FILE *json_f;

static void kill_children(void)
{
    if (feeder_pid > 0) {
        kill(feeder_pid, SIGKILL);
        waitpid(feeder_pid, NULL, 0);
        feeder_pid = -1;
    }
    for (int i = 0; i < nhogs; i++) {
        kill(hog_pids[i], SIGKILL);
        waitpid(hog_pids[i], NULL, 0);
    }
    nhogs = 0;
}

static void cleanup(void)
{
    kill_children();
    if (disk_path[0])
        unlink(disk_path);
    if (json_tmp[0])
        unlink(json_tmp);
}

/* perror-style: "waits: <what>: <strerror(errno)>", then exit 1 */
__attribute__((noreturn, format(printf, 1, 2)))
static void die(const char *fmt, ...)
{
    int e = errno;
    char what[PATH_MAX + 64];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s: %s: %s\n", prog, what, strerror(e));
    cleanup();
    exit(1);
}

static long long clock_ns(clockid_t id)
{
    struct timespec ts;

    if (clock_gettime(id, &ts) != 0)
        die("clock_gettime(%d)", (int)id);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static long long mono_ns(void) { return clock_ns(CLOCK_MONOTONIC); }
static long long cpu_ns(void) { return clock_ns(CLOCK_THREAD_CPUTIME_ID); }

/* this thread's schedstat: on-CPU ns and run-queue wait ns */
static void read_schedstat(struct tstat *t, long long *on_cpu, long long *runq)
{
    char buf[128];
    ssize_t n;
    char *p;

    n = pread(t->sched_fd, buf, sizeof buf - 1, 0);
    if (n <= 0)
        die("read /proc/self/task/%d/schedstat", (int)t->tid);
    buf[n] = '\0';
    *on_cpu = strtoll(buf, &p, 10);
    *runq = strtoll(p, NULL, 10);
}

/* this thread's task-clock: ns on a CPU, switch to switch */
static long long task_clock(const struct tstat *t)
{
    uint64_t ns;

    if (read(t->task_clock_fd, &ns, sizeof ns) != (ssize_t)sizeof ns)
        die("read the task-clock counter of %s", t->name);
    return (long long)ns;
}

static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

static int running(void)
{
    return !stop_requested && mono_ns() < deadline_ns;
}

/* ---- computation ------------------------------------------------------- */

/*
 * Integer/bit mixing over a small array; no calls of any kind, so a sample
 * taken while it runs has it as the leaf frame.  noipa keeps its symbol
 * name stable (no inlining, cloning or merging).
 */
__attribute__((noinline, noipa, used))
uint64_t waits_compute(uint64_t *s, unsigned n, unsigned iters)
{
    uint64_t acc = 0x9e3779b97f4a7c15ULL;

    for (unsigned it = 0; it < iters; it++) {
        for (unsigned j = 0; j < n; j++) {
            uint64_t x = s[j] ^ acc;
            x ^= x >> 31;
            x *= 0xbf58476d1ce4e5b9ULL;
            x ^= x >> 27;
            x = (x << 13) | (x >> 51);
            acc += x ^ s[(j + 7) % n];
            s[j] = x;
        }
    }
    return acc;
}

/* compute until this thread's CPU clock has advanced by `ns` */
static void burn(long long ns)
{
    uint64_t s[32];
    long long start = cpu_ns();

    for (unsigned i = 0; i < 32; i++)
        s[i] = i * 0x9e3779b97f4a7c15ULL + (uint64_t)start;
    do
        waits_sink += waits_compute(s, 32, 40);   /* a few microseconds */
    while (cpu_ns() - start < ns);
}

/* ---- measuring blocking calls ------------------------------------------ */

struct mark { long long mono, cpu, rq, tc; };

/* before a call: schedstat, task-clock, CPU clock, then the wall clock (nearest the call) */
static void mark_before(struct tstat *t, struct mark *m)
{
    long long on_cpu;

    read_schedstat(t, &on_cpu, &m->rq);
    m->tc = task_clock(t);
    m->cpu = cpu_ns();
    m->mono = mono_ns();
}

/* after it, in the reverse order; charge the call to `k`, counted under `f` (NFUNCS: not) */
static void mark_after(struct tstat *t, const struct mark *b, enum kind k, enum func f)
{
    long long mono = mono_ns(), cpu = cpu_ns(), tc = task_clock(t), on_cpu, rq;

    read_schedstat(t, &on_cpu, &rq);
    t->in_call[k] += mono - b->mono;
    t->in_call_cpu[k] += cpu - b->cpu;
    t->in_call_tc[k] += tc - b->tc;
    t->in_call_rq[k] += rq - b->rq;
    t->calls++;
    if (f < NFUNCS)
        t->fcalls[f]++;
}

static void thread_begin(struct tstat *t)
{
    char path[64];

    t->tid = gettid();
    pthread_setname_np(pthread_self(), t->name);
    snprintf(path, sizeof path, "/proc/self/task/%d/schedstat", (int)t->tid);
    t->sched_fd = open(path, O_RDONLY | O_CLOEXEC);
    if (t->sched_fd < 0)
        die("open %s", path);
    struct perf_event_attr attr = { .type = PERF_TYPE_SOFTWARE, .size = sizeof attr,
                                    .config = PERF_COUNT_SW_TASK_CLOCK };
    t->task_clock_fd = (int)syscall(SYS_perf_event_open, &attr, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (t->task_clock_fd < 0)
        die("perf_event_open(task-clock) for %s (run as root, or set kernel.perf_event_paranoid "
            "to 1 or lower)", t->name);
    pthread_barrier_wait(&start_barrier);
}

static void window_start(struct tstat *t)
{
    read_schedstat(t, &t->ss_cpu0, &t->ss_rq0);
    t->tc0 = task_clock(t);
    t->cpu0 = cpu_ns();
    t->mono0 = mono_ns();
}

static void window_end(struct tstat *t)
{
    t->mono1 = mono_ns();
    t->cpu1 = cpu_ns();
    t->tc1 = task_clock(t);
    read_schedstat(t, &t->ss_cpu1, &t->ss_rq1);
    close(t->sched_fd);
    close(t->task_clock_fd);
}

/* ---- the threads ------------------------------------------------------- */

static void *net_main(void *arg)
{
    struct tstat *t = arg;
    char buf[2048];
    struct mark m;

    thread_begin(t);
    /* datagrams sent while the disk file was written: not part of the run */
    while (recv(net_fd, buf, sizeof buf, MSG_DONTWAIT) >= 0)
        ;
    window_start(t);
    while (running()) {
        ssize_t r;

        mark_before(t, &m);
        r = recvfrom(net_fd, buf, sizeof buf, 0, NULL, NULL);
        mark_after(t, &m, K_NETWORK, F_RECVFROM);
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)
                continue;
            die("recvfrom");
        }
        burn(NET_WORK_NS);
    }
    window_end(t);
    return NULL;
}

static void *timer_main(void *arg)
{
    struct tstat *t = arg;
    const struct timespec nap = { 0, TIMER_SLEEP_NS };
    struct epoll_event ev;
    struct mark m;
    int epfd = epoll_create1(EPOLL_CLOEXEC);

    if (epfd < 0)
        die("epoll_create1");
    thread_begin(t);
    window_start(t);
    for (unsigned long long i = 1; running(); i++) {
        burn(TIMER_WORK_NS);
        mark_before(t, &m);
        if (i % TIMER_EPOLL_EVERY == 0) {
            if (epoll_wait(epfd, &ev, 1, TIMER_EPOLL_MS) < 0 && errno != EINTR)
                die("epoll_wait");
            mark_after(t, &m, K_TIMER, F_EPOLL);
        } else {
            int e = clock_nanosleep(CLOCK_MONOTONIC, 0, &nap, NULL);

            if (e != 0 && e != EINTR) {
                errno = e;
                die("clock_nanosleep");
            }
            mark_after(t, &m, K_TIMER, F_NANOSLEEP);
        }
    }
    window_end(t);
    close(epfd);
    return NULL;
}

static void *cond_main(void *arg)
{
    struct tstat *t = arg;
    unsigned long long seen = 0;
    struct mark m;

    thread_begin(t);
    window_start(t);
    for (;;) {
        int done;

        /* lock, wait for the next signal, unlock: all of it is futex waiting on w-signal */
        mark_before(t, &m);
        pthread_mutex_lock(&cond_mu);
        while (cond_seq == seen && !signal_done) {
            pthread_cond_wait(&cond_cv, &cond_mu);
            t->fcalls[F_CONDWAIT]++;
        }
        done = cond_seq == seen;     /* w-signal has stopped */
        seen = cond_seq;
        pthread_mutex_unlock(&cond_mu);
        mark_after(t, &m, K_THREAD, NFUNCS);  /* counted per pthread_cond_wait above */
        if (done || !running())
            break;
        burn(COND_WORK_NS);
    }
    window_end(t);
    return NULL;
}

/* absolute clock_nanosleep until `next` (CLOCK_MONOTONIC ns), measured as a timer wait */
static void sleep_until(struct tstat *t, long long next)
{
    struct timespec ts = { next / 1000000000LL, next % 1000000000LL };
    struct mark m;
    int e;

    mark_before(t, &m);
    do
        e = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
    while (e == EINTR);
    mark_after(t, &m, K_TIMER, F_NANOSLEEP);
    if (e != 0) {
        errno = e;
        die("clock_nanosleep");
    }
}

/* every 7 ms: compute ~1 ms, signal w-cond, sleep to the next tick */
static void *signal_main(void *arg)
{
    struct tstat *t = arg;
    long long next;

    thread_begin(t);
    window_start(t);
    next = t->mono0;
    while (running()) {
        long long now;

        burn(SIGNAL_WORK_NS);
        pthread_mutex_lock(&cond_mu);
        cond_seq++;
        pthread_cond_signal(&cond_cv);
        pthread_mutex_unlock(&cond_mu);
        next += SIGNAL_PERIOD_NS;
        now = mono_ns();
        if (next < now)             /* fell behind (busy host): a whole period from now */
            next = now + SIGNAL_PERIOD_NS - SIGNAL_WORK_NS;
        sleep_until(t, next);
    }
    window_end(t);
    pthread_mutex_lock(&cond_mu);
    signal_done = 1;
    pthread_cond_broadcast(&cond_cv);
    pthread_mutex_unlock(&cond_mu);
    return NULL;
}

static uint64_t rng_next(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* bursts of DISK_BURST reads at random offsets, then a DISK_PAUSE_NS sleep */
static void *disk_main(void *arg)
{
    struct tstat *t = arg;
    uint64_t rng = 0xd15cd15cULL;
    struct mark m;

    thread_begin(t);
    window_start(t);
    while (running()) {
        for (int i = 0; i < DISK_BURST; i++) {
            off_t off = (off_t)(rng_next(&rng) % (DISK_FILE_SIZE / DISK_CHUNK)) * DISK_CHUNK;
            size_t done = 0;

            if (!disk_direct)
                posix_fadvise(disk_fd, off, DISK_CHUNK, POSIX_FADV_DONTNEED);
            while (done < DISK_CHUNK) {
                ssize_t r;

                mark_before(t, &m);
                r = pread(disk_fd, disk_buf + done, DISK_CHUNK - done, off + (off_t)done);
                mark_after(t, &m, K_DISK, F_PREAD);
                if (r < 0) {
                    if (errno == EINTR)
                        continue;
                    die("pread %s", disk_path);
                }
                if (r == 0) {
                    errno = EIO;
                    die("pread %s: short file", disk_path);
                }
                done += (size_t)r;
            }
        }
        sleep_until(t, mono_ns() + DISK_PAUSE_NS);
    }
    window_end(t);
    return NULL;
}

/* ---- child processes --------------------------------------------------- */

/* in a forked child: die with the parent, take a name */
static void child_setup(const char *name)
{
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
        _exit(1);
    if (getppid() == 1)
        _exit(0);
    prctl(PR_SET_NAME, name);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_IGN);        /* Ctrl-C: the parent stops and kills us */
}

__attribute__((noreturn))
static void feeder_main(void)
{
    unsigned char msg[64] = { 'q' };
    long long next;
    int fd;

    child_setup("w-feeder");
    fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        _exit(1);
    next = mono_ns();
    for (;;) {
        struct timespec ts;

        next += FEED_PERIOD_NS;
        ts.tv_sec = next / 1000000000LL;
        ts.tv_nsec = next % 1000000000LL;
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
            ;
        if (sendto(fd, msg, sizeof msg, 0, (struct sockaddr *)&net_addr,
                   sizeof net_addr) < 0 && errno != ENOBUFS && errno != EAGAIN)
            _exit(1);
    }
}

__attribute__((noreturn))
static void hog_main(void)
{
    uint64_t s[32] = { 1 };

    child_setup("w-hog");
    for (;;)
        waits_sink += waits_compute(s, 32, 1000);
}

static pid_t spawn(void (*fn)(void))
{
    pid_t pid;

    fflush(NULL);
    pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0)
        fn();
    return pid;
}

/* ---- setup ------------------------------------------------------------- */

static void setup_net(void)
{
    socklen_t len = sizeof net_addr;
    struct timeval tv = { .tv_sec = 0, .tv_usec = RCV_TIMEOUT_US };

    net_fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (net_fd < 0)
        die("socket(AF_INET, SOCK_DGRAM)");
    memset(&net_addr, 0, sizeof net_addr);
    net_addr.sin_family = AF_INET;
    net_addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(net_fd, (struct sockaddr *)&net_addr, sizeof net_addr) != 0)
        die("bind(127.0.0.1:0)");
    if (getsockname(net_fd, (struct sockaddr *)&net_addr, &len) != 0)
        die("getsockname");
    if (setsockopt(net_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0)
        die("setsockopt(SO_RCVTIMEO)");
}

static void setup_disk(const char *workdir)
{
    uint64_t rng = 0x5eedULL;
    int n = snprintf(disk_path, sizeof disk_path, "%s/qprof-waits.%ld.dat",
                     workdir, (long)getpid());
    int fd;

    if (n < 0 || (size_t)n >= sizeof disk_path) {
        disk_path[0] = '\0';
        errno = ENAMETOOLONG;
        die("WORKDIR %s", workdir);
    }
    if (posix_memalign((void **)&disk_buf, 4096, DISK_CHUNK) != 0)
        die("posix_memalign");
    fd = open(disk_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        int e = errno;
        char failed[PATH_MAX];

        snprintf(failed, sizeof failed, "%s", disk_path);
        disk_path[0] = '\0';       /* nothing of ours to unlink */
        errno = e;
        die("open %s", failed);
    }
    for (long long off = 0; off < DISK_FILE_SIZE; off += DISK_CHUNK) {
        for (size_t i = 0; i < DISK_CHUNK / sizeof(uint64_t); i++)
            ((uint64_t *)disk_buf)[i] = rng_next(&rng);
        for (size_t done = 0; done < DISK_CHUNK;) {
            ssize_t r = write(fd, disk_buf + done, DISK_CHUNK - done);

            if (r < 0) {
                if (errno == EINTR)
                    continue;
                die("write %s", disk_path);
            }
            done += (size_t)r;
        }
    }
    if (fsync(fd) != 0)
        die("fsync %s", disk_path);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    if (close(fd) != 0)
        die("close %s", disk_path);

    /* O_DIRECT if the file system takes it (open and a first read), else page cache + fadvise */
    disk_fd = getenv("QPROF_WAITS_NO_DIRECT") ? -1 :
              open(disk_path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (disk_fd >= 0 && pread(disk_fd, disk_buf, DISK_CHUNK, 0) == DISK_CHUNK) {
        disk_direct = 1;
        return;
    }
    if (disk_fd >= 0)
        close(disk_fd);
    disk_fd = open(disk_path, O_RDONLY | O_CLOEXEC);
    if (disk_fd < 0)
        die("open %s", disk_path);
    posix_fadvise(disk_fd, 0, 0, POSIX_FADV_RANDOM);
}

/* Create OUT's temp file up front so an unwritable OUT fails at once. */
static void open_json(const char *out)
{
    int n = snprintf(json_tmp, sizeof json_tmp, "%s.tmp.%ld", out, (long)getpid());
    int fd;

    if (n < 0 || (size_t)n >= sizeof json_tmp) {
        json_tmp[0] = '\0';
        errno = ENAMETOOLONG;
        die("OUT %s", out);
    }
    fd = open(json_tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        char failed[PATH_MAX];

        snprintf(failed, sizeof failed, "%s", json_tmp);
        json_tmp[0] = '\0';
        errno = e;
        die("open %s", failed);
    }
    json_f = fdopen(fd, "w");
    if (!json_f)
        die("fdopen %s", json_tmp);
}

/* ---- output ------------------------------------------------------------ */

static void kind_dict(FILE *f, const char *key, const struct tstat *t,
                      const long long *a, const long long *b, const long long *c)
{
    const char *sep = "";

    fprintf(f, "\"%s\": {", key);
    for (int k = 0; k < NKINDS; k++) {
        if (!(t->kinds & (1u << k)))
            continue;
        fprintf(f, "%s\"%s\": %.6f", sep, kind_name[k],
                (a[k] - (b ? b[k] : 0) - (c ? c[k] : 0)) / 1e9);
        sep = ", ";
    }
    fprintf(f, "}, ");
}

static void write_json(const char *out, double secs, int busy, int cpus,
                       pid_t feeder, const pid_t *hogs, int n_hogs,
                       double disk_off_us, const char *disk_note)
{
    FILE *f = json_f;

    json_f = NULL;
    fprintf(f, "{\"pid\": %ld, \"seconds\": %.3f, \"busy\": %s, \"cpus\": %d, "
            "\"feeder_pid\": %ld, \"hog_pids\": [", (long)getpid(), secs,
            busy ? "true" : "false", cpus, (long)feeder);
    for (int i = 0; i < n_hogs; i++)
        fprintf(f, "%s%ld", i ? ", " : "", (long)hogs[i]);
    fprintf(f, "], \"disk_mode\": \"%s\", \"disk_reads\": %llu, "
            "\"disk_read_off_cpu_us\": %.1f, \"disk_note\": ",
            disk_direct ? "O_DIRECT" : "fadvise", threads[T_DISK].fcalls[F_PREAD],
            disk_off_us);
    if (disk_note)
        fprintf(f, "\"%s\"", disk_note);
    else
        fprintf(f, "null");
    fprintf(f, ", \"threads\": {");
    for (int i = 0; i < NTHREADS; i++) {
        const struct tstat *t = &threads[i];
        long long window = t->mono1 - t->mono0, off = 0;
        const char *sep = "";

        for (int k = 0; k < NKINDS; k++)
            off += t->in_call[k] - t->in_call_cpu[k] - t->in_call_rq[k];
        fprintf(f, "%s\"%s\": {\"tid\": %ld, \"window_s\": %.6f, \"cpu_s\": %.6f, "
                "\"schedstat_on_cpu_s\": %.6f, \"schedstat_runqueue_s\": %.6f, \"task_clock_s\": %.6f, ",
                i ? ", " : "", t->name, (long)t->tid, window / 1e9,
                (t->cpu1 - t->cpu0) / 1e9, (t->ss_cpu1 - t->ss_cpu0) / 1e9,
                (t->ss_rq1 - t->ss_rq0) / 1e9, (t->tc1 - t->tc0) / 1e9);
        kind_dict(f, "in_call_s", t, t->in_call, NULL, NULL);
        kind_dict(f, "in_call_cpu_s", t, t->in_call_cpu, NULL, NULL);
        kind_dict(f, "in_call_runqueue_s", t, t->in_call_rq, NULL, NULL);
        kind_dict(f, "in_call_task_clock_s", t, t->in_call_tc, NULL, NULL);
        kind_dict(f, "off_cpu_s", t, t->in_call, t->in_call_cpu, t->in_call_rq);
        fprintf(f, "\"residual_s\": %.6f, \"calls\": %llu, \"calls_by_function\": {",
                (window - (t->cpu1 - t->cpu0) - (t->ss_rq1 - t->ss_rq0) - off) / 1e9,
                t->calls);
        for (int fn = 0; fn < NFUNCS; fn++) {
            if (!t->fcalls[fn])
                continue;
            fprintf(f, "%s\"%s\": %llu", sep, func_name[fn], t->fcalls[fn]);
            sep = ", ";
        }
        fprintf(f, "}}");
    }
    fprintf(f, "}}\n");
    if (fflush(f) != 0 || fsync(fileno(f)) != 0)
        die("write %s", json_tmp);
    if (fclose(f) != 0)
        die("close %s", json_tmp);
    if (rename(json_tmp, out) != 0)
        die("rename %s to %s", json_tmp, out);
    json_tmp[0] = '\0';
}

__attribute__((noreturn))
static void usage(const char *problem)
{
    if (problem)
        fprintf(stderr, "%s: %s; ", prog, problem);
    fprintf(stderr, "usage: %s SECONDS OUT.json WORKDIR [--busy]"
            " (SECONDS = wall seconds > 0)\n", prog);
    exit(1);
}

int main(int argc, char **argv)
{
    int busy = 0, cpus = 1;
    pid_t feeder_copy, hogs_copy[1024];
    int nhogs_copy;
    const char *disk_note = NULL;
    double disk_off_us = 0.0;
    struct sigaction sa;
    struct stat st;
    char *end;
    double secs;

    if (argc > 0 && argv[0][0])
        prog = argv[0];
    if (argc == 5 && strcmp(argv[4], "--busy") == 0)
        busy = 1;
    else if (argc != 4)
        usage(argc == 5 ? "the fourth argument can only be --busy" : NULL);
    errno = 0;
    secs = strtod(argv[1], &end);
    if (errno || end == argv[1] || *end != '\0' || !isfinite(secs) ||
        secs <= 0 || secs > 1e6) {
        char msg[128];

        snprintf(msg, sizeof msg, "SECONDS must be a positive number, got '%.40s'", argv[1]);
        usage(msg);
    }
    if (argv[2][0] == '\0')
        usage("OUT.json is empty");
    if (argv[3][0] == '\0')
        usage("WORKDIR is empty");
    if (stat(argv[3], &st) != 0)
        die("WORKDIR %s", argv[3]);
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        die("WORKDIR %s", argv[3]);
    }

    printf("%ld\n", (long)getpid());
    fflush(stdout);

    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    if (sigaction(SIGTERM, &sa, NULL) != 0 || sigaction(SIGINT, &sa, NULL) != 0)
        die("sigaction");

    open_json(argv[2]);
    setup_net();
    feeder_pid = spawn(feeder_main);
    setup_disk(argv[3]);
    {
        long n = sysconf(_SC_NPROCESSORS_ONLN);

        cpus = n < 1 ? 1 : n > 1024 ? 1024 : (int)n;
    }
    for (int i = 0; busy && i < cpus; i++)
        hog_pids[nhogs++] = spawn(hog_main);

    if (pthread_barrier_init(&start_barrier, NULL, NTHREADS + 1) != 0)
        die("pthread_barrier_init");
    for (int i = 0; i < NTHREADS; i++) {
        int e = pthread_create(&threads[i].thread, NULL, threads[i].body, &threads[i]);

        if (e != 0) {
            errno = e;
            die("pthread_create %s", threads[i].name);
        }
    }
    deadline_ns = mono_ns() + (long long)(secs * 1e9);
    pthread_barrier_wait(&start_barrier);
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(threads[i].thread, NULL);

    feeder_copy = feeder_pid;
    nhogs_copy = nhogs;
    memcpy(hogs_copy, hog_pids, sizeof hog_pids[0] * (size_t)nhogs);
    kill_children();
    close(net_fd);
    close(disk_fd);
    if (unlink(disk_path) != 0)
        die("unlink %s", disk_path);
    disk_path[0] = '\0';

    {
        const struct tstat *d = &threads[T_DISK];
        long long off = d->in_call[K_DISK] - d->in_call_cpu[K_DISK] - d->in_call_rq[K_DISK];
        unsigned long long reads = d->fcalls[F_PREAD];

        disk_off_us = reads ? off / 1e3 / (double)reads : 0.0;
        if (!reads || disk_off_us < DISK_NOTE_US ||
            off < DISK_NOTE_SHARE * (double)(d->mono1 - d->mono0))
            disk_note = "the disk is too fast for its waits to show (or WORKDIR is "
                        "not on a block device): w-disk spent little time blocked in pread";
    }
    write_json(argv[2], secs, busy, cpus, feeder_copy, hogs_copy, nhogs_copy,
               disk_off_us, disk_note);
    if (disk_note)
        fprintf(stderr, "%s: note: %s (%.1f us off-CPU per read, %s)\n", prog, disk_note,
                disk_off_us, disk_direct ? "O_DIRECT" : "fadvise");
    return 0;
}
