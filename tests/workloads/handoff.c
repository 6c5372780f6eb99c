/*
 * handoff.c - ground-truth workload for qprof's attribution of thread handoffs.
 *
 * Three threads hand items to each other through queues guarded by a mutex and
 * two condition variables, the way a multi-threaded QUIC endpoint moves packets
 * between its connection, crypto and datapath threads:
 *
 *   h-producer  takes a free item, fills it (handoff_fill: the program's own
 *               computation, "Uncategorized"), pushes it to the work queue
 *   h-worker    pops it, encrypts its payload with AES-128-GCM through
 *               libcrypto EVP (handoff_seal: "Crypto"), pushes it to the send
 *               queue
 *   h-sender    pops it, sends its payload as UDP datagrams to its own socket
 *               on 127.0.0.1 and reads them back (handoff_transmit: sendto and
 *               recvfrom, "Packet I/O"), returns the item to the free queue
 *
 * The queue functions handoff_queue_push and handoff_queue_pop (noinline and
 * never tail-calling, built with frame pointers) do the queue's bookkeeping
 * under its lock (a hash mixed into the queue's state: inlined, so the
 * samples' leaf is the queue function itself) and block in pthread_cond_wait
 * while the queue is empty (pop) or full (push); pthread_mutex_lock waits when
 * another thread holds the lock.  The mapping file handoff.toml names the two
 * functions "Connection Mgmt": their time, the futex waits and wakes under
 * them included (the CPU a thread spends entering a wait, being switched out
 * and in, waking another thread), is "Connection Mgmt".  It also names
 * handoff_transmit and handoff_seal, the program's own code around the system
 * calls and libcrypto's calls, as their phases.
 *
 * Every thread reads CLOCK_THREAD_CPUTIME_ID between its phases, readings
 * chained so that each phase is charged exactly the thread CPU time between
 * the readings around it and the thread's phases add up to its total.  Time
 * a thread spends blocked is not CPU time and is charged to nobody; interrupts
 * taken while it runs (a kernel without IRQ time accounting) and another
 * tool's eBPF programs in its system calls are charged to the phase they ran
 * in.  Each interval between two readings also holds the cost of one clock
 * read (the end of one clock_gettime system call and the start of the next):
 * after every item, two back-to-back reads measure what a read costs right
 * there, and one read per interval is moved from the phase to "Uncategorized"
 * (the reads are the program's own code).
 *
 * An item carries ~0.7 ms of CPU work over the three threads, so that the
 * threads switch ~5,000 times per CPU second, not tens of thousands: the
 * kernel charges a thread that is switched in from another cgroup or from idle
 * for the switch (from the pick of the next task on), while perf's cgroup
 * events are still off, so sampling never sees that time; with items a third
 * of this size, "Connection Mgmt" (where the woken threads wait) came out up to
 * 2 pp below this clock on qprof's test VM, mostly for that reason.
 *
 * The producer stops filling items after SECONDS of wall time (or on
 * SIGTERM/SIGINT) and sends a stop item down the pipeline; each thread ends
 * when it passes it on.  Then OUT.json is written atomically (temp + rename):
 *   {"Packet I/O": s, "Crypto": s, "Connection Mgmt": s, "I/O": 0,
 *    "Uncategorized": s, "total": s, "fill": s, "clock_read_ns": ns,
 *    "items": n, "datagrams": n, "waits": n, "queue_ops": n,
 *    "threads": {"h-producer": {"tid": n, <the five categories>, "total": s,
 *                "clock_read_ns": ns, "schedstat_on_cpu_s": s,
 *                "voluntary_switches": n, "involuntary_switches": n},
 *                "h-worker": ..., "h-sender": ...}}
 * The five categories add up to "total", the sum over the three threads;
 * "fill" is the producer's fill less its clock reads (part of
 * "Uncategorized"); "waits" counts the pthread_cond_wait calls in the queue
 * functions; per thread, "schedstat_on_cpu_s" is the kernel's on-CPU time over
 * the same span (/proc/thread-self/schedstat: the same clock, a cross-check)
 * and the switch counts are getrusage(RUSAGE_THREAD)'s.
 *
 * Build: gcc -O2 -g -fno-omit-frame-pointer -Wall -Wextra -pthread \
 *            -o handoff handoff.c -lcrypto
 * Usage: handoff SECONDS OUT.json
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
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
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/evp.h>

/* ---- parameters -------------------------------------------------------- */

#define ITEMS           12          /* items in circulation */
#define QUEUE_CAP       4           /* the work and send queues' capacity (the free queue holds all) */
#define DATAGRAMS       80          /* datagrams per item */
#define DATAGRAM        1200        /* bytes per datagram */
#define PAYLOAD         (DATAGRAMS * DATAGRAM)
#define SEAL_PASSES     12          /* EVP_EncryptUpdate passes over the payload per item */
#define FILL_ROUNDS     6           /* mixing rounds over the payload's words per item */
#define BOOKKEEPING     10000       /* mixing steps per queue operation, under the lock */

enum { C_PACKET, C_CRYPTO, C_CONN, C_IO, C_UNCAT, NCATS };
static const char *const cat_name[NCATS] = {
    "Packet I/O", "Crypto", "Connection Mgmt", "I/O", "Uncategorized",
};

/* ---- items and queues -------------------------------------------------- */

struct item {
    uint64_t seq;
    int stop;
    unsigned char payload[PAYLOAD] __attribute__((aligned(64)));
    unsigned char sealed[PAYLOAD + 32] __attribute__((aligned(64)));
    unsigned char tag[16];
};

struct queue {
    pthread_mutex_t lock;
    pthread_cond_t not_empty, not_full;
    struct item *slot[ITEMS];
    unsigned head, count, cap;      /* cap: a full queue makes its pusher wait */
    uint64_t state;             /* the bookkeeping's running hash */
    unsigned long long waits;   /* pthread_cond_wait calls, under the lock */
    unsigned long long ops;
};

static struct queue free_q, work_q, send_q;
static struct item items[ITEMS];
static volatile sig_atomic_t stop_requested;
volatile uint64_t handoff_sink;

static const char *prog = "handoff";

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
    exit(1);
}

__attribute__((noreturn))
static void die_ssl(const char *what)
{
    unsigned long e = ERR_get_error();
    char buf[256];

    if (e)
        ERR_error_string_n(e, buf, sizeof buf);
    else
        snprintf(buf, sizeof buf, "failed");
    fprintf(stderr, "%s: %s: %s\n", prog, what, buf);
    exit(1);
}

static void queue_init(struct queue *q, unsigned cap)
{
    memset(q, 0, sizeof *q);
    q->cap = cap;
    if (pthread_mutex_init(&q->lock, NULL) != 0 || pthread_cond_init(&q->not_empty, NULL) != 0 ||
        pthread_cond_init(&q->not_full, NULL) != 0)
        die("pthread init");
    q->state = 0x9e3779b97f4a7c15ULL;
}

/* The queue's bookkeeping: inlined, so its samples have the queue function as their leaf. */
static inline __attribute__((always_inline)) void bookkeeping(struct queue *q, const struct item *it)
{
    uint64_t x = q->state ^ it->seq;

    for (int i = 0; i < BOOKKEEPING; i++) {
        x ^= x >> 31;
        x *= 0xbf58476d1ce4e5b9ULL;
        x ^= x >> 27;
        x += (uint64_t)it->payload[i & 63];
    }
    q->state = x;
    q->ops++;
}

__attribute__((noinline, noipa, used))
void handoff_queue_push(struct queue *q, struct item *it)
{
    if (pthread_mutex_lock(&q->lock) != 0)
        die("pthread_mutex_lock");
    while (q->count == q->cap) {
        q->waits++;
        pthread_cond_wait(&q->not_full, &q->lock);
    }
    bookkeeping(q, it);
    q->slot[(q->head + q->count) % q->cap] = it;
    q->count++;
    pthread_cond_signal(&q->not_empty);
    pthread_mutex_unlock(&q->lock);
    /* not a tail call: the unlock (and the futex wake under it) runs with this frame on the stack */
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline, noipa, used))
struct item *handoff_queue_pop(struct queue *q)
{
    struct item *it;

    if (pthread_mutex_lock(&q->lock) != 0)
        die("pthread_mutex_lock");
    while (q->count == 0) {
        q->waits++;
        pthread_cond_wait(&q->not_empty, &q->lock);
    }
    it = q->slot[q->head];
    q->head = (q->head + 1) % q->cap;
    q->count--;
    bookkeeping(q, it);
    pthread_cond_signal(&q->not_full);
    pthread_mutex_unlock(&q->lock);
    return it;
}

/* ---- per-thread clock -------------------------------------------------- */

struct clock {
    const char *name;
    pid_t tid;
    long long now;                  /* the last reading */
    long long ns[NCATS];            /* raw: reading to reading */
    long long intervals[NCATS];     /* how many intervals each category got */
    long long read_ns, reads_measured;
    long long start;
    long long sched_start, sched_end;   /* schedstat's on-CPU ns at the first and last reading */
    long nvcsw, nivcsw;                 /* its voluntary and involuntary context switches */
};

static long long thread_cpu_ns(void)
{
    struct timespec ts;

    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        die("clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The kernel's count of this thread's on-CPU ns (/proc/thread-self/schedstat): a cross-check. */
static long long schedstat_ns(void)
{
    long long on_cpu = -1;
    FILE *f = fopen("/proc/thread-self/schedstat", "r");

    if (f) {
        if (fscanf(f, "%lld", &on_cpu) != 1)
            on_cpu = -1;
        fclose(f);
    }
    return on_cpu;
}

static void clock_start(struct clock *c, const char *name)
{
    c->name = name;
    c->tid = (pid_t)syscall(SYS_gettid);
    pthread_setname_np(pthread_self(), name);
    c->sched_start = schedstat_ns();
    c->start = c->now = thread_cpu_ns();
}

static void clock_end(struct clock *c)
{
    struct rusage ru;

    c->sched_end = schedstat_ns();
    if (getrusage(RUSAGE_THREAD, &ru) == 0) {
        c->nvcsw = ru.ru_nvcsw;
        c->nivcsw = ru.ru_nivcsw;
    }
}

/* Charge the time since the last reading to `cat`. */
static inline void charge(struct clock *c, int cat)
{
    long long t = thread_cpu_ns();

    c->ns[cat] += t - c->now;
    c->intervals[cat]++;
    c->now = t;
}

/* Two back-to-back reads: what one costs here (charged to Uncategorized, the reads' own code). */
static inline void measure_read(struct clock *c)
{
    long long t = thread_cpu_ns();

    c->ns[C_UNCAT] += t - c->now;     /* the item's last interval's read is in it already */
    c->read_ns += t - c->now;
    c->reads_measured++;
    c->now = t;
}

/* What each category is worth once every interval's clock read is moved to Uncategorized. */
static void clock_truth(const struct clock *c, double out[NCATS], double *total, double *read_ns)
{
    double per = c->reads_measured ? (double)c->read_ns / (double)c->reads_measured : 0.0;

    *read_ns = per;
    *total = 0;
    for (int k = 0; k < NCATS; k++)
        out[k] = (double)c->ns[k];
    for (int k = 0; k < NCATS; k++) {
        if (k == C_UNCAT)
            continue;
        double moved = per * (double)c->intervals[k];

        if (moved > out[k])
            moved = out[k];
        out[k] -= moved;
        out[C_UNCAT] += moved;
    }
    for (int k = 0; k < NCATS; k++)
        *total += out[k];
}

/* ---- the phases -------------------------------------------------------- */

static EVP_CIPHER_CTX *gcm_ctx;
static unsigned char gcm_iv[12];
static int udp_fd = -1;
static struct sockaddr_in udp_addr;
static unsigned char udp_rx[2048];
static unsigned long long datagrams, udp_lost;

/* The producer's own work: filling the payload (no calls, so its samples' leaf is this function). */
__attribute__((noinline, noipa, used))
void handoff_fill(struct item *it, uint64_t seq)
{
    uint64_t *w = (uint64_t *)it->payload;
    uint64_t x = seq * 0x94d049bb133111ebULL + 1;

    it->seq = seq;
    for (int r = 0; r < FILL_ROUNDS; r++)
        for (size_t j = 0; j < PAYLOAD / sizeof *w; j++) {
            x ^= w[j] + (uint64_t)r;
            x *= 0xbf58476d1ce4e5b9ULL;
            x ^= x >> 29;
            w[j] = x;
        }
}

__attribute__((noinline, noipa, used))
void handoff_seal(struct item *it)
{
    int outl;

    for (int i = 0; i < 8; i++)
        if (++gcm_iv[11 - i] != 0)
            break;
    if (EVP_EncryptInit_ex(gcm_ctx, NULL, NULL, NULL, gcm_iv) != 1)
        die_ssl("EVP_EncryptInit_ex");
    for (int p = 0; p < SEAL_PASSES; p++)
        if (EVP_EncryptUpdate(gcm_ctx, it->sealed, &outl, it->payload, PAYLOAD) != 1)
            die_ssl("EVP_EncryptUpdate");
    if (EVP_EncryptFinal_ex(gcm_ctx, it->sealed, &outl) != 1)
        die_ssl("EVP_EncryptFinal_ex");
    if (EVP_CIPHER_CTX_ctrl(gcm_ctx, EVP_CTRL_GCM_GET_TAG, sizeof it->tag, it->tag) != 1)
        die_ssl("EVP_CIPHER_CTX_ctrl(GET_TAG)");
}

__attribute__((noinline, noipa, used))
void handoff_transmit(struct item *it)
{
    int sent = 0;

    for (int i = 0; i < DATAGRAMS; i++) {
        ssize_t r = sendto(udp_fd, it->sealed + (size_t)i * DATAGRAM, DATAGRAM, 0,
                           (struct sockaddr *)&udp_addr, sizeof udp_addr);
        if (r < 0) {
            if (errno == EINTR) { i--; continue; }
            if (errno == ENOBUFS || errno == EAGAIN)
                break;
            die("sendto");
        }
        sent++;
    }
    for (int i = 0; i < sent; i++) {
        ssize_t r = recvfrom(udp_fd, udp_rx, sizeof udp_rx, 0, NULL, NULL);
        if (r < 0) {
            if (errno == EINTR) { i--; continue; }
            if (errno == EAGAIN || errno == EWOULDBLOCK) { udp_lost++; break; }
            die("recvfrom");
        }
    }
    datagrams += (unsigned long long)sent;
}

/* ---- the threads ------------------------------------------------------- */

static struct clock clocks[3];
static double run_seconds;
static uint64_t produced;

static double mono_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *producer(void *arg)
{
    struct clock *c = arg;
    double end = mono_s() + run_seconds;
    int last = 0;
    struct item *it;

    clock_start(c, "h-producer");
    for (;;) {
        it = handoff_queue_pop(&free_q);
        charge(c, C_CONN);
        if (last) {
            it->stop = 1;
            handoff_queue_push(&work_q, it);
            charge(c, C_CONN);
            break;
        }
        handoff_fill(it, ++produced);
        last = stop_requested || mono_s() >= end;   /* a vDSO read in the program's own code */
        charge(c, C_UNCAT);
        handoff_queue_push(&work_q, it);
        charge(c, C_CONN);
        measure_read(c);
    }
    clock_end(c);
    return NULL;
}

static void *worker(void *arg)
{
    struct clock *c = arg;
    struct item *it;

    clock_start(c, "h-worker");
    for (;;) {
        it = handoff_queue_pop(&work_q);
        charge(c, C_CONN);
        if (!it->stop) {
            handoff_seal(it);
            charge(c, C_CRYPTO);
        }
        handoff_queue_push(&send_q, it);
        charge(c, C_CONN);
        if (it->stop)
            break;
        measure_read(c);
    }
    clock_end(c);
    return NULL;
}

static void *sender(void *arg)
{
    struct clock *c = arg;
    struct item *it;

    clock_start(c, "h-sender");
    for (;;) {
        it = handoff_queue_pop(&send_q);
        charge(c, C_CONN);
        if (it->stop)
            break;
        handoff_transmit(it);
        charge(c, C_PACKET);
        handoff_queue_push(&free_q, it);
        charge(c, C_CONN);
        measure_read(c);
    }
    clock_end(c);
    return NULL;
}

/* ---- setup and output -------------------------------------------------- */

static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

static void setup_udp(void)
{
    socklen_t len = sizeof udp_addr;
    struct timeval tv = { .tv_sec = 0, .tv_usec = 200000 };
    int rcvbuf = 1 << 20;

    udp_fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (udp_fd < 0)
        die("socket(AF_INET, SOCK_DGRAM)");
    memset(&udp_addr, 0, sizeof udp_addr);
    udp_addr.sin_family = AF_INET;
    udp_addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(udp_fd, (struct sockaddr *)&udp_addr, sizeof udp_addr) != 0)
        die("bind(127.0.0.1:0)");
    if (getsockname(udp_fd, (struct sockaddr *)&udp_addr, &len) != 0)
        die("getsockname");
    if (setsockopt(udp_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0)
        die("setsockopt(SO_RCVTIMEO)");
    setsockopt(udp_fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);   /* best effort */
}

static void setup_crypto(void)
{
    static const unsigned char key[16] = {
        0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07,
        0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f,
    };

    gcm_ctx = EVP_CIPHER_CTX_new();
    if (!gcm_ctx)
        die_ssl("EVP_CIPHER_CTX_new");
    if (EVP_EncryptInit_ex(gcm_ctx, EVP_aes_128_gcm(), NULL, key, gcm_iv) != 1)
        die_ssl("EVP_EncryptInit_ex(aes-128-gcm)");
}

static void write_json(const char *out, uint64_t nitems)
{
    char tmp[PATH_MAX];
    double sum[NCATS] = { 0 }, total = 0, fill;
    double per[3][NCATS], tot[3], rd[3], rd_all = 0;
    long long reads = 0;
    unsigned long long waits = free_q.waits + work_q.waits + send_q.waits;
    FILE *f;
    int n = snprintf(tmp, sizeof tmp, "%s.tmp.%ld", out, (long)getpid());

    if (n < 0 || (size_t)n >= sizeof tmp) {
        errno = ENAMETOOLONG;
        die("OUT %s", out);
    }
    for (int t = 0; t < 3; t++) {
        clock_truth(&clocks[t], per[t], &tot[t], &rd[t]);
        for (int k = 0; k < NCATS; k++)
            sum[k] += per[t][k];
        total += tot[t];
        rd_all += (double)clocks[t].read_ns;
        reads += clocks[t].reads_measured;
    }
    /* the producer's fill, less every read in its Uncategorized time */
    fill = (double)clocks[0].ns[C_UNCAT] - (double)clocks[0].read_ns - rd[0] * (double)clocks[0].intervals[C_UNCAT];
    f = fopen(tmp, "w");
    if (!f)
        die("open %s", tmp);
    fprintf(f, "{");
    for (int k = 0; k < NCATS; k++)
        fprintf(f, "\"%s\": %.6f, ", cat_name[k], sum[k] / 1e9);
    fprintf(f, "\"total\": %.6f, \"fill\": %.6f, \"clock_read_ns\": %.1f, \"items\": %llu, "
            "\"datagrams\": %llu, \"waits\": %llu, \"queue_ops\": %llu, \"threads\": {",
            total / 1e9, fill / 1e9, reads ? rd_all / (double)reads : 0.0, (unsigned long long)nitems,
            datagrams, waits, free_q.ops + work_q.ops + send_q.ops);
    for (int t = 0; t < 3; t++) {
        fprintf(f, "%s\"%s\": {\"tid\": %d, ", t ? ", " : "", clocks[t].name, (int)clocks[t].tid);
        for (int k = 0; k < NCATS; k++)
            fprintf(f, "\"%s\": %.6f, ", cat_name[k], per[t][k] / 1e9);
        fprintf(f, "\"total\": %.6f, \"clock_read_ns\": %.1f, \"schedstat_on_cpu_s\": %.6f, "
                "\"voluntary_switches\": %ld, \"involuntary_switches\": %ld}", tot[t] / 1e9, rd[t],
                (double)(clocks[t].sched_end - clocks[t].sched_start) / 1e9, clocks[t].nvcsw, clocks[t].nivcsw);
    }
    fprintf(f, "}}\n");
    if (fflush(f) != 0 || fsync(fileno(f)) != 0)
        die("write %s", tmp);
    if (fclose(f) != 0)
        die("close %s", tmp);
    if (rename(tmp, out) != 0)
        die("rename %s to %s", tmp, out);
}

int main(int argc, char **argv)
{
    pthread_t th[3];
    void *(*const fn[3])(void *) = { producer, worker, sender };
    struct sigaction sa;
    char *end;

    if (argc > 0 && argv[0][0])
        prog = argv[0];
    if (argc != 3) {
        fprintf(stderr, "usage: %s SECONDS OUT.json (SECONDS of wall time > 0)\n", prog);
        return 1;
    }
    errno = 0;
    run_seconds = strtod(argv[1], &end);
    if (errno || end == argv[1] || *end != '\0' || !isfinite(run_seconds) || run_seconds <= 0 ||
        run_seconds > 1e6) {
        fprintf(stderr, "%s: SECONDS must be a positive number, got '%.40s'\n", prog, argv[1]);
        return 1;
    }
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    if (sigaction(SIGTERM, &sa, NULL) != 0 || sigaction(SIGINT, &sa, NULL) != 0)
        die("sigaction");
    setup_udp();
    setup_crypto();
    queue_init(&free_q, ITEMS);
    queue_init(&work_q, QUEUE_CAP);
    queue_init(&send_q, QUEUE_CAP);
    for (int i = 0; i < ITEMS; i++) {
        for (size_t j = 0; j < PAYLOAD; j++)
            items[i].payload[j] = (unsigned char)(j * 13 + (size_t)i);
        /* the free queue holds QUEUE_CAP items; the rest wait in the pipeline's other queues */
        struct queue *q = i < QUEUE_CAP ? &free_q : i < 2 * QUEUE_CAP ? &work_q : &send_q;
        q->slot[q->count++] = &items[i];
    }
    for (int t = 0; t < 3; t++)
        if ((errno = pthread_create(&th[t], NULL, fn[t], &clocks[t])) != 0)
            die("pthread_create");
    for (int t = 0; t < 3; t++)
        pthread_join(th[t], NULL);
    write_json(argv[2], produced);
    EVP_CIPHER_CTX_free(gcm_ctx);
    close(udp_fd);
    if (udp_lost)
        fprintf(stderr, "%s: warning: %llu UDP datagrams lost\n", prog, udp_lost);
    return 0;
}
