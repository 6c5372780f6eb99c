/*
 * accuracy.c - ground-truth workload for qprof's CPU attribution.
 *
 * One thread spends self-measured CPU time in six kinds of work,
 * interleaved round-robin in short slices so that any sub-window of the
 * run has about the same proportions:
 *
 *   "Packet I/O"      UDP sendto()/recvfrom() of 1200-byte datagrams to
 *                     itself over 127.0.0.1 (batches of 8 out, 8 back)
 *   "Crypto"          AES-128-GCM encryption with OpenSSL libcrypto EVP
 *                     (16 KiB EVP_EncryptUpdate calls)
 *   "Connection Mgmt" integer/bit mixing in qprof_accuracy_compute(),
 *                     which makes no calls at all
 *   "I/O"             pwrite() of 64 KiB chunks into WORKDIR, the offset
 *                     cycling over the first 4 MiB of the file
 *   callbacks         libcrypto sorting a stack (OPENSSL_sk_sort, through
 *                     libc's qsort) with this program's comparator, which
 *                     memcpy()s each record and mixes it: the program's own
 *                     work under a library that a leaf-first walk would
 *                     give to the library ("Uncategorized", application)
 *   clock reads       back-to-back CLOCK_THREAD_CPUTIME_ID reads: a system
 *                     call no rule names, under this program ("Uncategorized")
 *
 * Target shares of thread CPU time: 35 / 20 / 15 / 15 / 10 / 5 %.  Each round
 * (~12 ms) gives every phase a CPU budget (plus any carried-over deficit or
 * surplus, plus +-30 % jitter against sampler aliasing) and runs whole
 * work units until it is used up, reading
 * CLOCK_THREAD_CPUTIME_ID after every unit.  Readings are chained, so each
 * phase is charged exactly the thread CPU time between its first and last
 * reading and the six phases add up to "total".  Every work unit ends with
 * two back-to-back clock reads, the program's own code: the time between them
 * is what one read costs right there, and twice that is moved from the phase
 * that made them to "Uncategorized".
 *
 * The run stops once SECONDS of thread CPU time (not wall time) have been
 * spent, or at the end of the current round after SIGTERM/SIGINT.  Then
 * OUT.json is written atomically (temp file + rename):
 *   {"Packet I/O": s, "Crypto": s, "Connection Mgmt": s, "I/O": s,
 *    "Uncategorized": s, "application": s, "clock_read_ns": ns,
 *    "clock_reads": n, "total": s, "rounds": n,
 *    "evp_encrypt_update_calls": n, "evp_encrypt_update_bytes": n}
 * where the five categories add up to "total" and "application" is the
 * callback phase alone (part of "Uncategorized").
 * The last two count this program's own EVP_EncryptUpdate calls and their
 * input bytes (ground truth for qprof's crypto uprobes).
 *
 * Build: gcc -O2 -g -fno-omit-frame-pointer -Wall -Wextra \
 *            -o accuracy accuracy.c -lcrypto
 * Usage: accuracy SECONDS OUT.json WORKDIR
 * Set QPROF_ACCURACY_VERBOSE=1 to get per-phase unit counts on stderr.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/stack.h>

/* ---- parameters -------------------------------------------------------- */

#define NPHASES 6
enum { PH_PACKET, PH_CRYPTO, PH_COMPUTE, PH_FILE, PH_CALLBACK, PH_CLOCK };

static const char *const phase_name[NPHASES] = {
    "Packet I/O", "Crypto", "Connection Mgmt", "I/O", "callbacks", "clock reads",
};

/* Nominal per-round CPU budgets in ns: 35/20/15/15/10/5 % of a 12 ms round.
 * Each slice is jittered by up to +-JITTER_PCT % (see main loop). */
#define ROUND_NS 12000000LL
static const long long phase_budget_ns[NPHASES] = {
    ROUND_NS * 35 / 100, ROUND_NS * 20 / 100, ROUND_NS * 15 / 100,
    ROUND_NS * 15 / 100, ROUND_NS * 10 / 100, ROUND_NS * 5 / 100,
};
#define JITTER_PCT 30

/* Work units (one clock reading per unit); each is tens of microseconds so
 * the clock_gettime() syscall stays a small fraction of every phase. */
#define UDP_PAYLOAD     1200
#define UDP_BATCH       8          /* datagrams in flight at most */
#define UDP_BATCHES     4          /* batches per unit */
#define GCM_CHUNK       (16 * 1024)
#define GCM_CHUNKS      16         /* EVP_EncryptUpdate calls per message */
#define COMPUTE_ITERS   600        /* passes over the array per unit */
#define FILE_CHUNK      (64 * 1024)
#define FILE_SPAN       (4 * 1024 * 1024)
#define FILE_WRITES     16         /* pwrite calls per unit */
#define SORT_ITEMS      16         /* records sorted per unit (~50 comparisons) */
#define RECORD_WORDS    128        /* 1 KiB per record, copied by every comparison */
#define MIX_PASSES      6          /* mixing passes over the copy per comparison */
#define CLOCK_READS     30         /* clock reads per unit, besides the unit's own two */

/* ---- state ------------------------------------------------------------- */

static volatile sig_atomic_t stop_requested;

static int udp_fd = -1;
static struct sockaddr_in udp_addr;
static unsigned char udp_tx[UDP_PAYLOAD];
static unsigned char udp_rx[2048];
static unsigned long long udp_timeouts;

static EVP_CIPHER_CTX *gcm_ctx;
static unsigned char gcm_in[GCM_CHUNK] __attribute__((aligned(64)));
static unsigned char gcm_out[GCM_CHUNK + 32] __attribute__((aligned(64)));
static unsigned char gcm_iv[12];
static unsigned char gcm_tag[16];

static uint64_t mix_state[64];
volatile uint64_t qprof_accuracy_sink;

static int file_fd = -1;
static char file_path[PATH_MAX];
static unsigned char file_buf[FILE_CHUNK] __attribute__((aligned(4096)));
static off_t file_off;

static OPENSSL_STACK *sort_stack;
static uint64_t sort_records[SORT_ITEMS][RECORD_WORDS];

static unsigned long long units_done[NPHASES];
static long long read_ns[NPHASES];      /* per phase: time between each unit's two reads */
static unsigned long long clock_reads;  /* all of them, the units' own included */
static unsigned long long evp_update_calls, evp_update_bytes;

/* ---- helpers ----------------------------------------------------------- */

static const char *prog = "accuracy";
static char json_tmp[PATH_MAX];
static FILE *json_f;

static void cleanup_files(void)
{
    if (file_path[0])
        unlink(file_path);
    if (json_tmp[0])
        unlink(json_tmp);
}

/* perror-style: "accuracy: <what>: <strerror(errno)>", then exit 1 */
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
    cleanup_files();
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
    cleanup_files();
    exit(1);
}

static long long thread_cpu_ns(void)
{
    struct timespec ts;

    clock_reads++;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        die("clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

/* ---- phase 3: plain computation ---------------------------------------- */

/*
 * Integer/bit mixing over a small array.  No calls of any kind (no libc,
 * no memcpy/memset), so every sample taken while it runs has it as the
 * leaf frame.  noipa keeps GCC from inlining, cloning (.constprop/.isra)
 * or merging it, so the symbol name is stable.
 */
__attribute__((noinline, noipa, used))
uint64_t qprof_accuracy_compute(uint64_t *s, unsigned n, unsigned iters)
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

/* ---- phase bodies (one work unit each) --------------------------------- */

static void udp_unit(void)
{
    for (int b = 0; b < UDP_BATCHES; b++) {
        int sent = 0;

        for (int i = 0; i < UDP_BATCH; i++) {
            udp_tx[0] = (unsigned char)i;
            ssize_t r = sendto(udp_fd, udp_tx, sizeof udp_tx, 0,
                               (struct sockaddr *)&udp_addr, sizeof udp_addr);
            if (r < 0) {
                if (errno == EINTR) { i--; continue; }
                if (errno == ENOBUFS || errno == EAGAIN)
                    break;      /* receive side full: drain what we have */
                die("sendto");
            }
            sent++;
        }
        for (int i = 0; i < sent; i++) {
            ssize_t r = recvfrom(udp_fd, udp_rx, sizeof udp_rx, 0, NULL, NULL);
            if (r < 0) {
                if (errno == EINTR) { i--; continue; }
                if (errno == EAGAIN || errno == EWOULDBLOCK) {
                    udp_timeouts++;     /* datagram lost; don't hang */
                    break;
                }
                die("recvfrom");
            }
        }
    }
}

static void crypto_unit(void)
{
    int outl;

    /* new IV per message; the key schedule and cipher are kept in ctx */
    for (int i = 0; i < 8; i++)
        if (++gcm_iv[11 - i] != 0)
            break;
    if (EVP_EncryptInit_ex(gcm_ctx, NULL, NULL, NULL, gcm_iv) != 1)
        die_ssl("EVP_EncryptInit_ex");
    for (int i = 0; i < GCM_CHUNKS; i++) {
        if (EVP_EncryptUpdate(gcm_ctx, gcm_out, &outl, gcm_in, GCM_CHUNK) != 1)
            die_ssl("EVP_EncryptUpdate");
        evp_update_calls++;
        evp_update_bytes += GCM_CHUNK;
    }
    if (EVP_EncryptFinal_ex(gcm_ctx, gcm_out, &outl) != 1)
        die_ssl("EVP_EncryptFinal_ex");
    if (EVP_CIPHER_CTX_ctrl(gcm_ctx, EVP_CTRL_GCM_GET_TAG,
                            sizeof gcm_tag, gcm_tag) != 1)
        die_ssl("EVP_CIPHER_CTX_ctrl(GET_TAG)");
}

static void compute_unit(void)
{
    qprof_accuracy_sink += qprof_accuracy_compute(
        mix_state, sizeof mix_state / sizeof mix_state[0], COMPUTE_ITERS);
}

/*
 * The comparator libcrypto's sort calls back: copies both records (memcpy, a
 * "transparent" helper whose caller decides) and hashes the copies in its own
 * loop (not qprof_accuracy_compute, which a user rule names Connection Mgmt).
 * noipa keeps its name as the symbol samples show.
 */
__attribute__((noinline, noipa, used))
int qprof_accuracy_compare(const void *pa, const void *pb)
{
    static uint64_t copy[2][RECORD_WORDS];
    const uint64_t *a = *(const uint64_t *const *)pa, *b = *(const uint64_t *const *)pb;
    uint64_t k[2] = { 0x243f6a8885a308d3ULL, 0x13198a2e03707344ULL };

    memcpy(copy[0], a, sizeof copy[0]);
    memcpy(copy[1], b, sizeof copy[1]);
    for (int r = 0; r < 2; r++)
        for (int pass = 0; pass < MIX_PASSES / 2; pass++)
            for (int j = 0; j < RECORD_WORDS; j++) {
                uint64_t x = copy[r][j] ^ k[r];
                x ^= x >> 29;
                x *= 0x94d049bb133111ebULL;
                k[r] += x ^ (x >> 32);
                copy[r][j] = x;
            }
    return k[0] < k[1] ? -1 : k[0] > k[1];
}

static void callback_unit(void)
{
    static unsigned rot;

    /* re-fill in a rotated order: the stack is unsorted again, the sort does real work */
    OPENSSL_sk_zero(sort_stack);
    rot++;
    for (unsigned i = 0; i < SORT_ITEMS; i++)
        if (!OPENSSL_sk_push(sort_stack, sort_records[(i * 7 + rot) % SORT_ITEMS]))
            die_ssl("OPENSSL_sk_push");
    OPENSSL_sk_sort(sort_stack);
}

static void clock_unit(void)
{
    for (int i = 0; i < CLOCK_READS; i++)
        qprof_accuracy_sink += (uint64_t)thread_cpu_ns();
}

static void file_unit(void)
{
    for (int i = 0; i < FILE_WRITES; i++) {
        size_t done = 0;

        while (done < FILE_CHUNK) {
            ssize_t r = pwrite(file_fd, file_buf + done, FILE_CHUNK - done,
                               file_off + (off_t)done);
            if (r < 0) {
                if (errno == EINTR)
                    continue;
                die("pwrite %s", file_path);
            }
            done += (size_t)r;
        }
        file_off += FILE_CHUNK;
        if (file_off >= FILE_SPAN)
            file_off = 0;
    }
}

/*
 * Run units of one phase until `budget_ns` of thread CPU time has passed
 * since `start` (the previous reading).  Returns the last clock reading,
 * which becomes the start of the next phase.
 *
 * The unit bodies are inlined into these functions, so the user-mode code
 * of each phase (the syscall call sites, loop bookkeeping) lives in a
 * function named after the phase.  Packet I/O spends ~2-3% of its CPU
 * here: the first instructions after every sendto()/recvfrom() return,
 * which samples hit as leaf accuracy_phase_packet_io with no kernel or
 * libc frame; a classifier should map these names to their phase.
 */
#define DEFINE_PHASE(fname, unit, idx)                                       \
    __attribute__((noinline, noipa))                                         \
    static long long fname(long long start, long long budget_ns)             \
    {                                                                        \
        long long now = start;                                               \
        if (budget_ns <= 0)                                                  \
            return now;                                                      \
        do {                                                                 \
            long long t;                                                     \
            unit();                                                          \
            units_done[idx]++;                                               \
            t = thread_cpu_ns();                                             \
            now = thread_cpu_ns();                                           \
            read_ns[idx] += now - t;                                         \
        } while (now - start < budget_ns);                                   \
        return now;                                                          \
    }

DEFINE_PHASE(accuracy_phase_packet_io, udp_unit, PH_PACKET)
DEFINE_PHASE(accuracy_phase_crypto, crypto_unit, PH_CRYPTO)
DEFINE_PHASE(accuracy_phase_conn_mgmt, compute_unit, PH_COMPUTE)
DEFINE_PHASE(accuracy_phase_file_io, file_unit, PH_FILE)
DEFINE_PHASE(accuracy_phase_callbacks, callback_unit, PH_CALLBACK)
DEFINE_PHASE(accuracy_phase_clock, clock_unit, PH_CLOCK)

typedef long long (*phase_fn)(long long, long long);
static const phase_fn phase_fns[NPHASES] = {
    accuracy_phase_packet_io, accuracy_phase_crypto,
    accuracy_phase_conn_mgmt, accuracy_phase_file_io,
    accuracy_phase_callbacks, accuracy_phase_clock,
};

/* Uniform in [-1, 1); splitmix64 with a fixed seed, so runs are
 * reproducible (the point is only to be uncorrelated with the sampler). */
static double jitter_unit(void)
{
    static uint64_t x = 0x5eed5eed5eed5eedULL;
    uint64_t z = (x += 0x9e3779b97f4a7c15ULL);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* ---- setup / output ---------------------------------------------------- */

static void setup_udp(void)
{
    socklen_t len = sizeof udp_addr;
    struct timeval tv = { .tv_sec = 0, .tv_usec = 200000 };

    udp_fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (udp_fd < 0)
        die("socket(AF_INET, SOCK_DGRAM)");
    memset(&udp_addr, 0, sizeof udp_addr);
    udp_addr.sin_family = AF_INET;
    udp_addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    udp_addr.sin_port = 0;
    if (bind(udp_fd, (struct sockaddr *)&udp_addr, sizeof udp_addr) != 0)
        die("bind(127.0.0.1:0)");
    if (getsockname(udp_fd, (struct sockaddr *)&udp_addr, &len) != 0)
        die("getsockname");
    /* a lost datagram must not block the run forever */
    if (setsockopt(udp_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0)
        die("setsockopt(SO_RCVTIMEO)");
    for (size_t i = 0; i < sizeof udp_tx; i++)
        udp_tx[i] = (unsigned char)(i * 31 + 7);
}

static void setup_crypto(void)
{
    static const unsigned char key[16] = {
        0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07,
        0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f,
    };

    for (size_t i = 0; i < sizeof gcm_in; i++)
        gcm_in[i] = (unsigned char)(i * 13 + 1);
    gcm_ctx = EVP_CIPHER_CTX_new();
    if (!gcm_ctx)
        die_ssl("EVP_CIPHER_CTX_new");
    if (EVP_EncryptInit_ex(gcm_ctx, EVP_aes_128_gcm(), NULL, key, gcm_iv) != 1)
        die_ssl("EVP_EncryptInit_ex(aes-128-gcm)");
}

static void setup_file(const char *workdir)
{
    int n = snprintf(file_path, sizeof file_path,
                     "%s/qprof-accuracy.%ld.dat", workdir, (long)getpid());

    if (n < 0 || (size_t)n >= sizeof file_path) {
        file_path[0] = '\0';
        errno = ENAMETOOLONG;
        die("WORKDIR %s", workdir);
    }
    file_fd = open(file_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (file_fd < 0) {
        int e = errno;
        char failed[PATH_MAX];

        snprintf(failed, sizeof failed, "%s", file_path);
        file_path[0] = '\0';       /* nothing of ours to unlink */
        errno = e;
        die("open %s", failed);
    }
    for (size_t i = 0; i < sizeof file_buf; i++)
        file_buf[i] = (unsigned char)(i * 7 + 3);
}

/* Create OUT's temp file up front so an unwritable OUT fails at once. */
static void open_json(const char *out)
{
    int n = snprintf(json_tmp, sizeof json_tmp, "%s.tmp.%ld", out,
                     (long)getpid());
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

static void setup_compute(void)
{
    uint64_t x = 0x0123456789abcdefULL;

    for (size_t i = 0; i < sizeof mix_state / sizeof mix_state[0]; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        mix_state[i] = x;
    }
    for (size_t i = 0; i < SORT_ITEMS; i++)
        for (size_t j = 0; j < RECORD_WORDS; j++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            sort_records[i][j] = x;
        }
    sort_stack = OPENSSL_sk_new(qprof_accuracy_compare);
    if (!sort_stack)
        die_ssl("OPENSSL_sk_new");
}

/*
 * The truth per category: each of the first four phases less its clock reads
 * (two per unit, each costing what the time between them says); "Uncategorized"
 * is the callback and clock phases plus those reads.
 */
static void write_json(const char *out, const long long ns[NPHASES],
                       long long total_ns, unsigned long long rounds)
{
    FILE *f = json_f;
    double uncat = (double)(ns[PH_CALLBACK] + ns[PH_CLOCK]);
    unsigned long long units = 0;
    long long between = 0;

    json_f = NULL;
    fprintf(f, "{");
    for (int i = 0; i < PH_CALLBACK; i++) {
        uncat += 2.0 * (double)read_ns[i];
        fprintf(f, "\"%s\": %.6f, ", phase_name[i], (ns[i] - 2.0 * (double)read_ns[i]) / 1e9);
    }
    for (int i = 0; i < NPHASES; i++) {
        units += units_done[i];
        between += read_ns[i];
    }
    fprintf(f, "\"Uncategorized\": %.6f, \"application\": %.6f, \"clock_read_ns\": %.1f, "
            "\"clock_reads\": %llu, ", uncat / 1e9, ns[PH_CALLBACK] / 1e9,
            units ? (double)between / (double)units : 0.0, clock_reads);
    fprintf(f, "\"total\": %.6f, \"rounds\": %llu, \"evp_encrypt_update_calls\": %llu, "
            "\"evp_encrypt_update_bytes\": %llu}\n", total_ns / 1e9, rounds,
            evp_update_calls, evp_update_bytes);
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
        fprintf(stderr, "%s: %s; usage: %s SECONDS OUT.json WORKDIR"
                " (SECONDS = thread CPU seconds > 0)\n", prog, problem, prog);
    else
        fprintf(stderr, "usage: %s SECONDS OUT.json WORKDIR"
                " (SECONDS = thread CPU seconds > 0)\n", prog);
    exit(1);
}

int main(int argc, char **argv)
{
    long long spent_ns[NPHASES] = { 0 };
    long long target_ns[NPHASES] = { 0 };
    unsigned long long rounds = 0;
    long long start, now, limit_ns;
    struct sigaction sa;
    struct stat st;
    char *end;
    double secs;

    if (argc > 0 && argv[0][0])
        prog = argv[0];
    if (argc != 4)
        usage(NULL);
    errno = 0;
    secs = strtod(argv[1], &end);
    if (errno || end == argv[1] || *end != '\0' || !isfinite(secs) ||
        secs <= 0 || secs > 1e6) {
        char msg[128];

        snprintf(msg, sizeof msg, "SECONDS must be a positive number, got '%.40s'",
                 argv[1]);
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
    limit_ns = (long long)(secs * 1e9);

    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    if (sigaction(SIGTERM, &sa, NULL) != 0 || sigaction(SIGINT, &sa, NULL) != 0)
        die("sigaction");

    open_json(argv[2]);
    setup_udp();
    setup_crypto();
    setup_compute();
    setup_file(argv[3]);

    /*
     * Main loop.  Each phase's allowance this round is its cumulative
     * target minus what it has already been charged (so the overshoot of
     * the last unit in a slice is paid back in the next round and the
     * shares converge on the targets), plus a pseudo-random jitter of up
     * to +-JITTER_PCT % of its nominal slice.  Without the jitter, rounds
     * of a fixed length alias with a periodic sampler (perf -F 999 gives
     * ~12 samples per 12 ms round at nearly fixed offsets), biasing the
     * shares seen in sub-windows by several points.
     */
    start = now = thread_cpu_ns();
    while (!stop_requested && now - start < limit_ns) {
        for (int p = 0; p < NPHASES; p++) {
            long long t0 = now;
            long long jitter = (long long)(jitter_unit() *
                (double)phase_budget_ns[p] * JITTER_PCT / 100.0);

            target_ns[p] += phase_budget_ns[p];
            now = phase_fns[p](t0, target_ns[p] - spent_ns[p] + jitter);
            spent_ns[p] += now - t0;
        }
        rounds++;
    }

    if (close(file_fd) != 0)
        die("close %s", file_path);
    if (unlink(file_path) != 0)
        die("unlink %s", file_path);
    file_path[0] = '\0';
    close(udp_fd);
    EVP_CIPHER_CTX_free(gcm_ctx);
    OPENSSL_sk_free(sort_stack);

    write_json(argv[2], spent_ns, now - start, rounds);

    if (udp_timeouts)
        fprintf(stderr, "%s: warning: %llu UDP datagrams lost\n",
                prog, udp_timeouts);
    if (getenv("QPROF_ACCURACY_VERBOSE")) {
        for (int p = 0; p < NPHASES; p++)
            fprintf(stderr, "%-16s %10.6f s %5.2f%% %10llu units %8.1f us/unit\n",
                    phase_name[p], spent_ns[p] / 1e9,
                    100.0 * spent_ns[p] / (double)(now - start), units_done[p],
                    units_done[p] ? spent_ns[p] / 1e3 / units_done[p] : 0.0);
        fprintf(stderr, "total %.6f s, %llu rounds, %.3f ms/round\n",
                (now - start) / 1e9, rounds,
                rounds ? (now - start) / 1e6 / rounds : 0.0);
    }
    return 0;
}
