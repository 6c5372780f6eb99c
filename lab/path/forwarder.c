/* forwarder: an Ethernet wire with a one-way delay and random loss between two interfaces.
 *
 *   forwarder --a IFACE --b IFACE [--delay-us N] [--loss-ab P] [--loss-ba P] [--seed N]
 *             [--queue-bytes N] [--coalesce-us N] [--interval-ms N] [--rcvbuf N] [--fifo PRIO]
 *
 * Every frame received on one interface is written to the other `--delay-us` after the kernel
 * received it (its SO_TIMESTAMPNS stamp, so the forwarder's own wake-up latency on the receive
 * side adds nothing), unless it is dropped: at random with probability P of its direction
 * (xorshift64* seeded from --seed, one generator per direction: the same frames in the same order
 * meet the same fate, ARP and any other frame included, so a run is reproducible), or
 * because its direction's queue is full (--queue-bytes of frames waiting, counted apart).
 * The forwarder is an L2 bridge of two ports: it never looks at addresses, so the hosts on
 * either side keep one subnet, ARP and all.
 *
 * Frames travel with a virtio_net_hdr (PACKET_VNET_HDR) so a frame whose checksum the sending
 * host left to the device (CHECKSUM_PARTIAL on veth) leaves as such: the receiving host's stack
 * accepts it as the sender's device would have delivered it. Frames are MTU-sized when the lab
 * disabled segmentation offloads on the senders' devices; a GSO frame that still comes through
 * is forwarded whole (counted as gso_frames).
 *
 * Each direction's frames wait in a ring (variable-size records, FIFO: the delay is constant,
 * so arrival order is due order). Receiving and sending are batched (recvmmsg/sendmmsg, 64 at
 * a time). While frames wait the forwarder sleeps until the first is due (epoll_pwait2 with a
 * nanosecond timeout, timer slack 1 ns) and drains its sockets then, not on every arrival:
 * a frame's due time comes from its kernel timestamp, so draining late costs nothing as long as
 * it is drained before it is due (at most `horizon` = min(delay/2, 5 ms) later). Wake-ups are
 * at least --coalesce-us apart (default 50): at high packet rates frames go out in batches, at
 * most that much late. Idle (nothing queued) it blocks until a frame arrives.
 *
 * With --fifo PRIO it runs SCHED_FIFO at that priority when the kernel lets it (else as it was
 * started, said in its counters as "sched"): it stands for a network, not a tenant of the host, so
 * the hosts' processes must not delay its frames (measured here: frames up to 2 ms late at 100-300
 * Mbit/s of TCP beside the two endpoints under SCHED_OTHER, under 0.3 ms with SCHED_FIFO). The
 * kernel's RT throttling (sched_rt_runtime_us) still leaves the others 5% of each CPU. When both
 * endpoints keep every CPU busy (an unshaped ngtcp2 transfer at 0.6-0.9 Gbit/s on 2 CPUs) the
 * kernel's own work in their contexts still holds it off at times: a few frames per thousand
 * left 1 to 30 ms late there; the counters say so (late_*, oversleep_max_us).
 *
 * Counters go to stdout as one JSON line: at start ("event":"start": the sockets are bound),
 * on SIGUSR1 ("stats"), every --interval-ms if given ("stats"), and on SIGTERM/SIGINT/SIGHUP
 * ("exit", then exit 0). Per direction: frames received, forwarded, random_drops, queue_drops,
 * send_errors (the device refused the frame), socket_drops (the kernel dropped the frame before
 * the forwarder read it: the forwarder was too slow), truncated (larger than 64 KiB), gso_frames,
 * the frames and bytes queued now and the most bytes ever queued, and how late frames left
 * after their due time (late_mean_us, late_max_us, late_over_1ms), and how many of those the
 * forwarder made late itself (late_own_over_1ms, late_own_max_us: a frame's lateness less the time
 * the forwarder was kept from running since its last wait: how much later than asked that wait
 * returned (after a wait without a timeout: how long after the first frame came), and the wall
 * time since then that is not its CPU time, when the guest's scheduler or the host, taking the
 * VM's CPU away, held it off. What is left is its own: waking later than a frame's due time, or
 * work it had not finished; a forwarder that cannot keep up never waits), and how many were held
 * off over 0.5 ms (late_held_over_500us: the lateness that is not its own). Process-wide: its own CPU
 * seconds (getrusage: user, system; the system time includes the receiving host's softirq work
 * that the kernel runs inside the forwarder's send calls, as it would inside any sender's on
 * veth: about a third of it in a TCP transfer, measured with perf), wake-ups, the longest pass of
 * its loop (turn_max_us) and the most a timed wait overslept (oversleep_max_us: when frames are
 * late and this is large, the forwarder was kept off its CPU; when it is small, it was busy).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <linux/if_packet.h>
#include <linux/virtio_net.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifndef PACKET_IGNORE_OUTGOING
#define PACKET_IGNORE_OUTGOING 23
#endif

#define BATCH 64
#define DRAIN_ROUNDS 16                 /* batches per socket per loop turn */
#define VNET ((uint32_t)sizeof(struct virtio_net_hdr))
#define SLOT (VNET + 65536u)            /* a receive buffer: a vnet header and the largest frame */
#define WRAP 0xffffffffu
#define NONE UINT64_MAX

static void die(const char *what) {
    fprintf(stderr, "forwarder: %s: %s\n", what, strerror(errno));
    exit(1);
}

static uint64_t clock_ns(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- a ring of variable-size records, FIFO ---------------------------------------------- */

struct rec {
    uint64_t due;  /* CLOCK_MONOTONIC ns */
    uint32_t size; /* bytes after this header (vnet header + frame), or WRAP */
    uint32_t pad;
};
#define HDR ((size_t)sizeof(struct rec))

struct ring {
    uint8_t *buf;
    size_t cap, head, tail, count;
    size_t frame_bytes, limit, max_frame_bytes; /* frames' bytes queued (no vnet header), limit, peak */
};

static size_t rec_span(uint32_t size) { return (HDR + size + 15) & ~(size_t)15; }

static struct rec *rec_at(struct ring *r, size_t off) { return (struct rec *)(r->buf + off); }

/* The offset a record stored at or after `off` really starts at (the writer wraps to 0 when the
 * end has no room: a WRAP marker, or too few bytes for a header). */
static size_t rec_norm(struct ring *r, size_t off) {
    if (r->cap - off < HDR || rec_at(r, off)->size == WRAP)
        return 0;
    return off;
}

static struct rec *ring_push(struct ring *r, uint64_t due, const uint8_t *data, uint32_t size) {
    size_t need = rec_span(size), at;
    if (r->count == 0)
        r->head = r->tail = 0;
    if (r->count == 0 || r->tail > r->head) {
        if (r->cap - r->tail >= need) {
            at = r->tail;
        } else if (need <= r->head) { /* wrap: room at the front, up to the oldest record */
            if (r->cap - r->tail >= HDR)
                rec_at(r, r->tail)->size = WRAP;
            at = 0;
        } else {
            return NULL;
        }
    } else if (r->tail + need <= r->head) { /* wrapped already: room between the newest and oldest */
        at = r->tail;
    } else {
        return NULL;
    }
    struct rec *rec = rec_at(r, at);
    rec->due = due;
    rec->size = size;
    memcpy(rec + 1, data, size);
    r->tail = at + need;
    r->count++;
    r->frame_bytes += size - VNET;
    if (r->frame_bytes > r->max_frame_bytes)
        r->max_frame_bytes = r->frame_bytes;
    return rec;
}

static struct rec *ring_peek(struct ring *r) {
    if (r->count == 0)
        return NULL;
    r->head = rec_norm(r, r->head);
    return rec_at(r, r->head);
}

static void ring_pop(struct ring *r) {
    struct rec *rec = ring_peek(r);
    r->head += rec_span(rec->size);
    r->count--;
    r->frame_bytes -= rec->size - VNET;
}

/* ---- one direction: a socket in, a socket out, a queue, a loss process, counters -------------- */

struct counters {
    uint64_t received, forwarded, bytes, random_drops, queue_drops, send_errors, socket_drops, truncated,
        gso_frames, late_over_1ms, late_max_ns, late_sum_ns, late_own_over_1ms, late_own_max_ns, late_held_over_500us,
        discarded;
};

struct dir {
    const char *name;
    int in, out;
    double loss;
    uint64_t threshold; /* drop when the next random number is below it */
    int always;         /* loss >= 1 */
    uint64_t rng;
    struct ring q;
    struct counters c;
    uint8_t *slots;
    struct mmsghdr rx[BATCH], tx[BATCH];
    struct iovec rx_iov[BATCH], tx_iov[BATCH];
    struct sockaddr_ll rx_addr[BATCH];
    uint8_t rx_ctl[BATCH][64];
};

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t xorshift64star(uint64_t *s) {
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545f4914f6cdd1dull;
}

static uint64_t delay_ns, horizon_ns, coalesce_ns;
static uint64_t start_mono;
static uint64_t wakeups, turn_max_ns, oversleep_max_ns;
/* when the last wait returned (monotonic, the thread's CPU clock) and how much later than asked */
static uint64_t woke_mono, woke_cpu, woke_over;
static int woke_idle; /* that wait had no timeout: nothing was queued */

/* A wait returned at `mono`, `over` later than it asked (`idle`: it asked for no time). */
static void woke(uint64_t mono, uint64_t over, int idle) {
    woke_mono = mono;
    woke_cpu = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    woke_over = over;
    woke_idle = idle;
}
static char sched_name[32] = "other";

static void dir_init(struct dir *d, const char *name, int in, int out, double loss, uint64_t seed, size_t limit) {
    memset(d, 0, sizeof *d);
    d->name = name;
    d->in = in;
    d->out = out;
    d->loss = loss;
    d->always = loss >= 1.0;
    d->threshold = loss <= 0.0 || loss >= 1.0 ? 0 : (uint64_t)(loss * 18446744073709551616.0);
    uint64_t sm = seed;
    d->rng = splitmix64(&sm) | 1; /* xorshift needs a nonzero state */
    d->q.limit = limit;
    d->q.cap = 2 * limit + 4 * (size_t)SLOT; /* small frames carry a header each: room for them too */
    d->q.buf = mmap(NULL, d->q.cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    d->slots = mmap(NULL, (size_t)BATCH * SLOT, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                    -1, 0);
    if (d->q.buf == MAP_FAILED || d->slots == MAP_FAILED)
        die("mmap");
    for (int i = 0; i < BATCH; i++) {
        d->rx_iov[i].iov_base = d->slots + (size_t)i * SLOT;
        d->rx_iov[i].iov_len = SLOT;
        d->rx[i].msg_hdr.msg_iov = &d->rx_iov[i];
        d->rx[i].msg_hdr.msg_iovlen = 1;
        d->tx[i].msg_hdr.msg_iov = &d->tx_iov[i];
        d->tx[i].msg_hdr.msg_iovlen = 1;
    }
}

static uint64_t rx_time(struct msghdr *mh, uint64_t now_mono, int64_t real_minus_mono) {
    for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_TIMESTAMPNS) {
            struct timespec ts;
            memcpy(&ts, CMSG_DATA(c), sizeof ts);
            int64_t real = (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
            if (real == 0)
                break;
            int64_t mono = real - real_minus_mono;
            return mono > (int64_t)now_mono || mono <= 0 ? now_mono : (uint64_t)mono;
        }
    }
    return now_mono;
}

static void take(struct dir *d, struct mmsghdr *m, uint64_t now_mono, int64_t real_minus_mono) {
    uint8_t *data = m->msg_hdr.msg_iov->iov_base;
    uint32_t size = m->msg_len;
    d->c.received++;
    if ((m->msg_hdr.msg_flags & MSG_TRUNC) || size < VNET + 14) {
        d->c.truncated++;
        return;
    }
    struct sockaddr_ll *sll = m->msg_hdr.msg_name;
    if (m->msg_hdr.msg_namelen >= sizeof *sll && sll->sll_pkttype == PACKET_OUTGOING) {
        d->c.received--; /* the path's own host sent it (PACKET_IGNORE_OUTGOING missing): not traffic */
        return;
    }
    struct virtio_net_hdr *vh = (struct virtio_net_hdr *)data;
    if (vh->gso_type != VIRTIO_NET_HDR_GSO_NONE)
        d->c.gso_frames++;
    vh->flags &= (uint8_t)~VIRTIO_NET_HDR_F_DATA_VALID; /* a receive-side flag: not for sending */
    if (d->always || (d->threshold && xorshift64star(&d->rng) < d->threshold)) {
        d->c.random_drops++;
        return;
    }
    uint64_t rx = rx_time(&m->msg_hdr, now_mono, real_minus_mono), due = rx + delay_ns;
    if (woke_idle && woke_mono > rx && woke_mono - rx > woke_over)
        woke_over = woke_mono - rx; /* it waited for no time; it was held off since the frame came */
    if (d->q.frame_bytes + (size - VNET) > d->q.limit || !ring_push(&d->q, due, data, size))
        d->c.queue_drops++;
}

/* Read what waits on the socket; returns 1 when it stopped with frames possibly left. */
static int drain(struct dir *d) {
    uint64_t now = clock_ns(CLOCK_MONOTONIC);
    int64_t real_minus_mono = (int64_t)(clock_ns(CLOCK_REALTIME) - now);
    for (int round = 0; round < DRAIN_ROUNDS; round++) {
        for (int i = 0; i < BATCH; i++) {
            d->rx[i].msg_hdr.msg_name = &d->rx_addr[i];
            d->rx[i].msg_hdr.msg_namelen = sizeof d->rx_addr[i];
            d->rx[i].msg_hdr.msg_control = d->rx_ctl[i];
            d->rx[i].msg_hdr.msg_controllen = sizeof d->rx_ctl[i];
            d->rx[i].msg_hdr.msg_flags = 0;
        }
        int n = recvmmsg(d->in, d->rx, BATCH, MSG_DONTWAIT | MSG_TRUNC, NULL);
        if (n < 0) {
            if (errno != EAGAIN && errno != EINTR)
                die("recvmmsg");
            return 0;
        }
        for (int i = 0; i < n; i++)
            take(d, &d->rx[i], now, real_minus_mono);
        if (n < BATCH)
            return 0;
    }
    return 1;
}

static void sent(struct dir *d, uint64_t now, uint64_t kept_off) {
    struct rec *rec = ring_peek(&d->q);
    uint64_t late = now > rec->due ? now - rec->due : 0;
    uint64_t own = late > kept_off ? late - kept_off : 0;
    if (late > d->c.late_max_ns)
        d->c.late_max_ns = late;
    d->c.late_sum_ns += late;
    if (late > 1000000)
        d->c.late_over_1ms++;
    if (own > d->c.late_own_max_ns)
        d->c.late_own_max_ns = own;
    if (own > 1000000)
        d->c.late_own_over_1ms++;
    if (late - own > 500000)
        d->c.late_held_over_500us++;
    d->c.forwarded++;
    d->c.bytes += rec->size - VNET;
    ring_pop(&d->q);
}

/* Send every frame that is due. */
static void send_due(struct dir *d) {
    uint64_t now = clock_ns(CLOCK_MONOTONIC);
    while (d->q.count) {
        int n = 0;
        size_t off = d->q.head;
        for (size_t i = 0; i < d->q.count && n < BATCH; i++) {
            off = rec_norm(&d->q, off);
            struct rec *rec = rec_at(&d->q, off);
            if (rec->due > now)
                break;
            d->tx_iov[n].iov_base = rec + 1;
            d->tx_iov[n].iov_len = rec->size;
            n++;
            off += rec_span(rec->size);
        }
        if (n == 0)
            return;
        int k = sendmmsg(d->out, d->tx, n, 0);
        if (k < 0) { /* the first frame was refused (e.g. ENOBUFS: the device dropped it) */
            d->c.send_errors++;
            ring_pop(&d->q);
            continue;
        }
        uint64_t kept_off = 0;
        if (now > ring_peek(&d->q)->due) { /* a late batch (the CPU clock is a system call) */
            uint64_t cpu = clock_ns(CLOCK_THREAD_CPUTIME_ID) - woke_cpu;
            uint64_t wall = clock_ns(CLOCK_MONOTONIC) - woke_mono;
            kept_off = woke_over + (wall > cpu ? wall - cpu : 0);
        }
        for (int i = 0; i < k; i++)
            sent(d, now, kept_off);
        /* k < n: the next call starts at the refused frame and reports its error */
    }
}

static uint64_t head_due(struct dir *d) {
    struct rec *rec = ring_peek(&d->q);
    return rec ? rec->due : NONE;
}

/* ---- setup and the loop ----------------------------------------------------------------- */

static int open_port(const char *ifname, int rcvbuf) {
    unsigned idx = if_nametoindex(ifname);
    if (!idx) {
        fprintf(stderr, "forwarder: no interface %s in this network namespace\n", ifname);
        exit(1);
    }
    /* protocol 0 until bound: nothing from other interfaces is queued before the bind */
    int s = socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, 0);
    if (s < 0)
        die("socket(AF_PACKET)");
    int one = 1, sndbuf = 256 << 20;
    if (setsockopt(s, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof one) < 0)
        die("PACKET_VNET_HDR");
    (void)setsockopt(s, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one); /* else filtered by pkttype */
    if (setsockopt(s, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf) < 0)
        die("SO_RCVBUFFORCE");
    if (setsockopt(s, SOL_SOCKET, SO_SNDBUFFORCE, &sndbuf, sizeof sndbuf) < 0)
        die("SO_SNDBUFFORCE");
    if (setsockopt(s, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one) < 0)
        die("SO_TIMESTAMPNS");
    struct sockaddr_ll sll = {.sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_ALL), .sll_ifindex = (int)idx};
    if (bind(s, (struct sockaddr *)&sll, sizeof sll) < 0)
        die("bind");
    return s;
}

static void socket_drops(struct dir *d) {
    struct tpacket_stats st;
    socklen_t len = sizeof st;
    if (getsockopt(d->in, SOL_PACKET, PACKET_STATISTICS, &st, &len) == 0) /* reading resets them */
        d->c.socket_drops += st.tp_drops;
}

static double tv_s(struct timeval tv) { return (double)tv.tv_sec + (double)tv.tv_usec / 1e6; }

static void print_dir(struct dir *d) {
    struct counters *c = &d->c;
    printf("\"%s\": {\"loss\": %.17g, \"received\": %" PRIu64 ", \"forwarded\": %" PRIu64 ", \"bytes\": %" PRIu64
           ", \"random_drops\": %" PRIu64 ", \"queue_drops\": %" PRIu64 ", \"send_errors\": %" PRIu64
           ", \"socket_drops\": %" PRIu64 ", \"truncated\": %" PRIu64 ", \"gso_frames\": %" PRIu64
           ", \"queued\": %zu, \"queued_bytes\": %zu, \"max_queued_bytes\": %zu, \"queue_limit_bytes\": %zu"
           ", \"late_mean_us\": %.1f, \"late_max_us\": %.1f, \"late_over_1ms\": %" PRIu64
           ", \"late_own_max_us\": %.1f, \"late_own_over_1ms\": %" PRIu64 ", \"late_held_over_500us\": %" PRIu64
           ", \"discarded\": %" PRIu64 "}",
           d->name, d->loss, c->received, c->forwarded, c->bytes, c->random_drops, c->queue_drops, c->send_errors,
           c->socket_drops, c->truncated, c->gso_frames, d->q.count, d->q.frame_bytes, d->q.max_frame_bytes,
           d->q.limit, c->forwarded ? (double)c->late_sum_ns / (double)c->forwarded / 1e3 : 0.0,
           (double)c->late_max_ns / 1e3, c->late_over_1ms, (double)c->late_own_max_ns / 1e3, c->late_own_over_1ms,
           c->late_held_over_500us, c->discarded);
}

static void report(const char *event, struct dir *ab, struct dir *ba, uint64_t seed) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    socket_drops(ab);
    socket_drops(ba);
    printf("{\"event\": \"%s\", \"pid\": %d, \"t\": %.6f, \"delay_us\": %.3f, \"seed\": %" PRIu64
           ", \"sched\": \"%s\", ", event, (int)getpid(), (double)(clock_ns(CLOCK_MONOTONIC) - start_mono) / 1e9,
           (double)delay_ns / 1e3, seed, sched_name);
    print_dir(ab);
    printf(", ");
    print_dir(ba);
    printf(", \"cpu_seconds\": %.6f, \"cpu_user\": %.6f, \"cpu_system\": %.6f, \"wakeups\": %" PRIu64
           ", \"turn_max_us\": %.1f, \"oversleep_max_us\": %.1f}\n",
           tv_s(ru.ru_utime) + tv_s(ru.ru_stime), tv_s(ru.ru_utime), tv_s(ru.ru_stime), wakeups,
           (double)turn_max_ns / 1e3, (double)oversleep_max_ns / 1e3);
    fflush(stdout);
}

static void usage(void) {
    fprintf(stderr, "usage: forwarder --a IFACE --b IFACE [--delay-us N] [--loss-ab P] [--loss-ba P]\n"
                    "                 [--seed N] [--queue-bytes N] [--coalesce-us N] [--interval-ms N]\n"
                    "                 [--rcvbuf N] [--fifo PRIO]\n");
    exit(2);
}

static double number(const char *s, double lo, double hi) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "forwarder: %s is not a number in [%g, %g]\n", s, lo, hi);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv) {
    const char *a = NULL, *b = NULL;
    double delay_us = 0, loss_ab = 0, loss_ba = 0, coalesce_us = 50, interval_ms = 0;
    uint64_t seed = 1;
    size_t queue_bytes = 1 << 20;
    int rcvbuf = 16 << 20, fifo = 0;
    static const struct option opts[] = {
        {"a", required_argument, 0, 'a'},           {"b", required_argument, 0, 'b'},
        {"delay-us", required_argument, 0, 'd'},    {"loss-ab", required_argument, 0, 'l'},
        {"loss-ba", required_argument, 0, 'L'},     {"seed", required_argument, 0, 's'},
        {"queue-bytes", required_argument, 0, 'q'}, {"coalesce-us", required_argument, 0, 'c'},
        {"interval-ms", required_argument, 0, 'i'}, {"rcvbuf", required_argument, 0, 'r'},
        {"fifo", required_argument, 0, 'f'},
        {0, 0, 0, 0}};
    for (int o; (o = getopt_long(argc, argv, "", opts, NULL)) != -1;) {
        switch (o) {
        case 'a': a = optarg; break;
        case 'b': b = optarg; break;
        case 'd': delay_us = number(optarg, 0, 60e6); break;
        case 'l': loss_ab = number(optarg, 0, 1); break;
        case 'L': loss_ba = number(optarg, 0, 1); break;
        case 's': seed = (uint64_t)number(optarg, 0, 9007199254740992.0); break;
        case 'q': queue_bytes = (size_t)number(optarg, 65536, 1ull << 34); break;
        case 'c': coalesce_us = number(optarg, 0, 10000); break;
        case 'i': interval_ms = number(optarg, 0, 3600e3); break;
        case 'r': rcvbuf = (int)number(optarg, 65536, 1 << 30); break;
        case 'f': fifo = (int)number(optarg, 0, 99); break;
        default: usage();
        }
    }
    if (!a || !b || optind != argc)
        usage();
    delay_ns = (uint64_t)(delay_us * 1e3);
    horizon_ns = delay_ns / 2 < 5000000 ? delay_ns / 2 : 5000000;
    coalesce_ns = (uint64_t)(coalesce_us * 1e3);
    uint64_t interval_ns = (uint64_t)(interval_ms * 1e6);

    static char outbuf[1 << 16];
    setvbuf(stdout, outbuf, _IOFBF, sizeof outbuf); /* each counters line leaves in one write */
    prctl(PR_SET_TIMERSLACK, 1UL);                  /* wake when asked, not up to 50 us later */
    struct sched_param sp = {.sched_priority = fifo};
    if (fifo > 0 && sched_setscheduler(0, SCHED_FIFO | SCHED_RESET_ON_FORK, &sp) == 0)
        snprintf(sched_name, sizeof sched_name, "fifo:%d", fifo);
    else if (fifo > 0)
        fprintf(stderr, "forwarder: SCHED_FIFO refused (%s): running as started\n", strerror(errno));
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGHUP);
    sigaddset(&sigs, SIGUSR1);
    if (sigprocmask(SIG_BLOCK, &sigs, NULL) < 0)
        die("sigprocmask");
    int sfd = signalfd(-1, &sigs, SFD_NONBLOCK | SFD_CLOEXEC);
    if (sfd < 0)
        die("signalfd");

    int sa = open_port(a, rcvbuf), sb = open_port(b, rcvbuf);
    static struct dir ab, ba;
    uint64_t sm = seed;
    dir_init(&ab, "a_to_b", sa, sb, loss_ab, splitmix64(&sm), queue_bytes);
    dir_init(&ba, "b_to_a", sb, sa, loss_ba, splitmix64(&sm), queue_bytes);

    /* two epoll sets: idle (frames may arrive any time: wake on them) and waiting (frames queued:
     * wake when one is due, or on a signal) */
    int ep_idle = epoll_create1(EPOLL_CLOEXEC), ep_wait = epoll_create1(EPOLL_CLOEXEC);
    if (ep_idle < 0 || ep_wait < 0)
        die("epoll_create1");
    struct epoll_event ev = {.events = EPOLLIN};
    int fds[] = {sa, sb, sfd};
    for (int i = 0; i < 3; i++) {
        ev.data.fd = fds[i];
        if (epoll_ctl(ep_idle, EPOLL_CTL_ADD, fds[i], &ev) < 0)
            die("epoll_ctl");
    }
    ev.data.fd = sfd;
    if (epoll_ctl(ep_wait, EPOLL_CTL_ADD, sfd, &ev) < 0)
        die("epoll_ctl");

    start_mono = clock_ns(CLOCK_MONOTONIC);
    woke(start_mono, 0, 0);
    report("start", &ab, &ba, seed);
    uint64_t next_report = interval_ns ? start_mono + interval_ns : NONE;
    for (;;) {
        uint64_t turn = clock_ns(CLOCK_MONOTONIC);
        struct signalfd_siginfo si;
        int asked = 0;
        while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
            if (si.ssi_signo == SIGUSR1) {
                asked = 1;
                continue;
            }
            ab.c.discarded += ab.q.count;
            ba.c.discarded += ba.q.count;
            report("exit", &ab, &ba, seed);
            return 0;
        }
        if (asked)
            report("stats", &ab, &ba, seed);
        int more = drain(&ab) | drain(&ba);
        send_due(&ab);
        send_due(&ba);
        uint64_t now = clock_ns(CLOCK_MONOTONIC);
        if (now - turn > turn_max_ns)
            turn_max_ns = now - turn;
        if (now >= next_report) {
            report("stats", &ab, &ba, seed);
            next_report += interval_ns * ((now - next_report) / interval_ns + 1);
        }
        if (more)
            continue;
        uint64_t next = head_due(&ab), nb = head_due(&ba);
        next = nb < next ? nb : next;
        struct epoll_event got[4];
        int ep;
        uint64_t wake;
        if (next == NONE) {
            ep = ep_idle;
            wake = next_report;
        } else {
            ep = ep_wait;
            wake = next > turn + coalesce_ns ? next : turn + coalesce_ns;
            if (wake > now + horizon_ns)
                wake = now + horizon_ns;
            if (wake > next_report)
                wake = next_report;
        }
        wakeups++;
        if (wake == NONE) {
            if (epoll_pwait2(ep, got, 4, NULL, NULL) < 0 && errno != EINTR)
                die("epoll_pwait2");
            woke(clock_ns(CLOCK_MONOTONIC), 0, 1);
        } else if (wake > now) {
            struct timespec to = {.tv_sec = (time_t)((wake - now) / 1000000000ull),
                                  .tv_nsec = (long)((wake - now) % 1000000000ull)};
            int n = epoll_pwait2(ep, got, 4, &to, NULL);
            if (n < 0 && errno != EINTR)
                die("epoll_pwait2");
            uint64_t back = clock_ns(CLOCK_MONOTONIC);
            woke(back, back > wake ? back - wake : 0, 0);
            if (n == 0 && back > wake && back - wake > oversleep_max_ns)
                oversleep_max_ns = back - wake;
        }
    }
}
