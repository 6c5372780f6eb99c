/*
 * h3client.c - an HTTP/3 download client on libngtcp2 + libnghttp3 + GnuTLS, for qprof's tests.
 *
 *   h3client ADDR PORT BYTES    GET https://ADDR:PORT/BYTES from ngtcp2's example server
 *                               (gtlsserver answers a numeric path with that many bytes),
 *                               print "bytes=N seconds=S", exit 0
 *
 * With QPROF_BULK_WORK=PASSES it does work of its own where the stack hands it
 * the response body: inside nghttp3's recv_data callback, itself called from
 * libngtcp2's recv_stream_data callback, it hashes every chunk PASSES times
 * (checksum), timing each call with the TSC between fences (a chunk is ~1 KiB: two
 * clock system calls per chunk would cost more than the work; what the timing itself
 * adds, measured on empty brackets at the end, is taken out), and adds
 * "work_seconds=W cpu_seconds=T" to its line. T is the client's task-clock
 * (perf_event_open; it is single-threaded): like the TSC, and like the cpu-clock
 * a profiler samples with, it counts time the host takes from the vCPU while the
 * client runs (steal), which the kernel's CPU clock leaves out: W and T then
 * count the same kind of time. (Without the timing's own cost taken out, W/T
 * read 1.6-2.2 pp above qprof's share of checksum, 2026-11-28; with it 0.7-1.4.)
 *
 * One UDP socket, one datagram per sendto/recvfrom, poll(2) with ngtcp2's next
 * expiry as the timeout. The server's certificate is not verified (tests only).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/perf_event.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#include <gnutls/crypto.h>
#include <gnutls/gnutls.h>
#include <nghttp3/nghttp3.h>
#include <ngtcp2/ngtcp2.h>
#include <ngtcp2/ngtcp2_crypto.h>
#include <ngtcp2/ngtcp2_crypto_gnutls.h>

#define MAX_DATAGRAM 1472
#define WINDOW (64 << 20)

struct client {
    int fd;
    struct sockaddr_in local, remote;
    ngtcp2_conn *conn;
    ngtcp2_crypto_conn_ref conn_ref;
    gnutls_session_t session;
    gnutls_certificate_credentials_t cred;
    nghttp3_conn *h3;
    int64_t request;
    const char *authority, *path;
    uint64_t got, want;
    int done;
    /* the client's own work (QPROF_BULK_WORK) */
    int passes;
    uint64_t work_cycles, work_calls, sink;
};

static void die(const char *what, const char *why)
{
    fprintf(stderr, "h3client: %s: %s\n", what, why);
    exit(1);
}

static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int by_value(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

    return (x > y) - (x < y);
}

/* What the timing of one call adds to it (the fences and the second TSC read): the median of
 * empty brackets, ~25 ns here; at ~1 KiB a call that is a few percent of the work, which a profile
 * puts in the caller, not in checksum. */
static uint64_t bracket_cycles(void)
{
    enum { ROUNDS = 101, EACH = 1000 };
    uint64_t per[ROUNDS];

    for (int r = 0; r < ROUNDS; r++) {
        uint64_t sum = 0;

        for (int i = 0; i < EACH; i++) {
            _mm_lfence();
            uint64_t t0 = __rdtsc();

            _mm_lfence();
            __asm__ volatile("" ::: "memory");
            _mm_lfence();
            sum += __rdtsc() - t0;
        }
        per[r] = sum / EACH;
    }
    qsort(per, ROUNDS, sizeof per[0], by_value);
    return per[ROUNDS / 2];
}

/* the calling thread's task-clock, counting from now (see the top) */
static int open_task_clock(void)
{
    struct perf_event_attr attr = {.type = PERF_TYPE_SOFTWARE, .size = sizeof attr,
                                   .config = PERF_COUNT_SW_TASK_CLOCK};
    int fd = (int)syscall(SYS_perf_event_open, &attr, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);

    if (fd < 0)
        die("perf_event_open(task-clock) for QPROF_BULK_WORK (run as root, or set "
            "kernel.perf_event_paranoid <= 1)", strerror(errno));
    return fd;
}

static double task_clock_seconds(int fd)
{
    uint64_t ns;

    if (read(fd, &ns, sizeof ns) != (ssize_t)sizeof ns)
        die("read(task-clock)", strerror(errno));
    return ns / 1e9;
}

/* The client's own work on what it receives: hashes each 8-byte word PASSES times. */
__attribute__((noinline)) uint64_t checksum(const uint8_t *p, size_t n, int passes)
{
    uint64_t h = 0xcbf29ce484222325ULL;

    for (int r = 0; r < passes; r++)
        for (size_t i = 0; i + 8 <= n; i += 8) {
            uint64_t x;

            memcpy(&x, p + i, 8);
            x ^= h;
            x ^= x >> 29;
            x *= 0xbf58476d1ce4e5b9ULL;
            h += x ^ (x >> 32);
        }
    return h;
}

static void consume(struct client *c, int64_t stream_id, size_t n)
{
    ngtcp2_conn_extend_max_stream_offset(c->conn, stream_id, n);
    ngtcp2_conn_extend_max_offset(c->conn, n);
}

/* ---- nghttp3 callbacks -------------------------------------------------- */

static int h3_recv_data(nghttp3_conn *h3, int64_t stream_id, const uint8_t *data, size_t datalen,
                        void *user_data, void *stream_user_data)
{
    struct client *c = user_data;

    (void)h3;
    (void)stream_user_data;
    if (c->passes) {
        /* rdtsc does not wait for earlier instructions: without the fences the second read ran
         * ahead of the hash's dependency chain and the work read 5-8% short of qprof's samples */
        _mm_lfence();
        uint64_t t0 = __rdtsc();

        _mm_lfence();
        c->sink += checksum(data, datalen, c->passes);
        _mm_lfence();
        c->work_cycles += __rdtsc() - t0;
        c->work_calls++;
    }
    c->got += datalen;
    consume(c, stream_id, datalen);
    return 0;
}

static int h3_deferred_consume(nghttp3_conn *h3, int64_t stream_id, size_t consumed, void *user_data,
                               void *stream_user_data)
{
    (void)h3;
    (void)stream_user_data;
    consume(user_data, stream_id, consumed);
    return 0;
}

static int h3_end_stream(nghttp3_conn *h3, int64_t stream_id, void *user_data, void *stream_user_data)
{
    struct client *c = user_data;

    (void)h3;
    (void)stream_user_data;
    if (stream_id == c->request)
        c->done = 1;
    return 0;
}

static void start_http3(struct client *c)
{
    nghttp3_callbacks cb = {
        .recv_data = h3_recv_data,
        .deferred_consume = h3_deferred_consume,
        .end_stream = h3_end_stream,
    };
    nghttp3_settings settings;
    int64_t ctrl, enc, dec;
    const nghttp3_nv nva[] = {
        {(uint8_t *)":method", (uint8_t *)"GET", 7, 3, NGHTTP3_NV_FLAG_NONE},
        {(uint8_t *)":scheme", (uint8_t *)"https", 7, 5, NGHTTP3_NV_FLAG_NONE},
        {(uint8_t *)":authority", (uint8_t *)c->authority, 10, strlen(c->authority), NGHTTP3_NV_FLAG_NONE},
        {(uint8_t *)":path", (uint8_t *)c->path, 5, strlen(c->path), NGHTTP3_NV_FLAG_NONE},
    };

    nghttp3_settings_default(&settings);
    if (nghttp3_conn_client_new(&c->h3, &cb, &settings, NULL, c) != 0)
        die("nghttp3_conn_client_new", "failed");
    if (ngtcp2_conn_open_uni_stream(c->conn, &ctrl, NULL) || ngtcp2_conn_open_uni_stream(c->conn, &enc, NULL) ||
        ngtcp2_conn_open_uni_stream(c->conn, &dec, NULL))
        die("ngtcp2_conn_open_uni_stream", "no streams");
    if (nghttp3_conn_bind_control_stream(c->h3, ctrl) || nghttp3_conn_bind_qpack_streams(c->h3, enc, dec))
        die("nghttp3 bind streams", "failed");
    if (ngtcp2_conn_open_bidi_stream(c->conn, &c->request, NULL))
        die("ngtcp2_conn_open_bidi_stream", "no stream");
    if (nghttp3_conn_submit_request(c->h3, c->request, nva, sizeof nva / sizeof nva[0], NULL, NULL))
        die("nghttp3_conn_submit_request", "failed");
}

/* ---- ngtcp2 callbacks --------------------------------------------------- */

static int handshake_completed(ngtcp2_conn *conn, void *user_data)
{
    (void)conn;
    start_http3(user_data);
    return 0;
}

static int recv_stream_data(ngtcp2_conn *conn, uint32_t flags, int64_t stream_id, uint64_t offset,
                            const uint8_t *data, size_t datalen, void *user_data, void *stream_user_data)
{
    struct client *c = user_data;
    nghttp3_ssize n;

    (void)conn;
    (void)offset;
    (void)stream_user_data;
    n = nghttp3_conn_read_stream(c->h3, stream_id, data, datalen, flags & NGTCP2_STREAM_DATA_FLAG_FIN);
    if (n < 0)
        return NGTCP2_ERR_CALLBACK_FAILURE;
    consume(c, stream_id, (size_t)n);
    return 0;
}

static int acked_stream_data_offset(ngtcp2_conn *conn, int64_t stream_id, uint64_t offset, uint64_t datalen,
                                    void *user_data, void *stream_user_data)
{
    struct client *c = user_data;

    (void)conn;
    (void)offset;
    (void)stream_user_data;
    return c->h3 && nghttp3_conn_add_ack_offset(c->h3, stream_id, datalen) ? NGTCP2_ERR_CALLBACK_FAILURE : 0;
}

static int stream_close(ngtcp2_conn *conn, uint32_t flags, int64_t stream_id, uint64_t app_error_code,
                        void *user_data, void *stream_user_data)
{
    struct client *c = user_data;

    (void)conn;
    (void)stream_user_data;
    if (!(flags & NGTCP2_STREAM_CLOSE_FLAG_APP_ERROR_CODE_SET))
        app_error_code = NGHTTP3_H3_NO_ERROR;
    if (c->h3) {
        int rv = nghttp3_conn_close_stream(c->h3, stream_id, app_error_code);

        if (rv != 0 && rv != NGHTTP3_ERR_STREAM_NOT_FOUND)
            return NGTCP2_ERR_CALLBACK_FAILURE;
    }
    return 0;
}

static int extend_max_stream_data(ngtcp2_conn *conn, int64_t stream_id, uint64_t max_data, void *user_data,
                                  void *stream_user_data)
{
    struct client *c = user_data;

    (void)conn;
    (void)max_data;
    (void)stream_user_data;
    return c->h3 && nghttp3_conn_unblock_stream(c->h3, stream_id) ? NGTCP2_ERR_CALLBACK_FAILURE : 0;
}

static void rand_cb(uint8_t *dest, size_t destlen, const ngtcp2_rand_ctx *rand_ctx)
{
    (void)rand_ctx;
    gnutls_rnd(GNUTLS_RND_RANDOM, dest, destlen);
}

static int get_new_connection_id(ngtcp2_conn *conn, ngtcp2_cid *cid, uint8_t *token, size_t cidlen,
                                 void *user_data)
{
    (void)conn;
    (void)user_data;
    gnutls_rnd(GNUTLS_RND_RANDOM, cid->data, cidlen);
    cid->datalen = cidlen;
    gnutls_rnd(GNUTLS_RND_RANDOM, token, NGTCP2_STATELESS_RESET_TOKENLEN);
    return 0;
}

static ngtcp2_conn *get_conn(ngtcp2_crypto_conn_ref *ref)
{
    return ((struct client *)ref->user_data)->conn;
}

/* ---- set-up ------------------------------------------------------------- */

static void setup_tls(struct client *c)
{
    gnutls_datum_t alpn = {(unsigned char *)"h3", 2};

    if (gnutls_certificate_allocate_credentials(&c->cred) ||
        gnutls_init(&c->session, GNUTLS_CLIENT | GNUTLS_ENABLE_EARLY_DATA | GNUTLS_NO_END_OF_EARLY_DATA) ||
        gnutls_priority_set_direct(c->session, "%DISABLE_TLS13_COMPAT_MODE:NORMAL:-VERS-ALL:+VERS-TLS1.3:"
                                   "-CIPHER-ALL:+AES-128-GCM:+AES-256-GCM:+CHACHA20-POLY1305", NULL) ||
        ngtcp2_crypto_gnutls_configure_client_session(c->session) ||
        gnutls_credentials_set(c->session, GNUTLS_CRD_CERTIFICATE, c->cred) ||
        gnutls_alpn_set_protocols(c->session, &alpn, 1, GNUTLS_ALPN_MANDATORY) ||
        gnutls_server_name_set(c->session, GNUTLS_NAME_DNS, "localhost", 9))
        die("GnuTLS set-up", "failed");
    c->conn_ref.get_conn = get_conn;
    c->conn_ref.user_data = c;
    gnutls_session_set_ptr(c->session, &c->conn_ref);
}

static void setup_quic(struct client *c)
{
    ngtcp2_callbacks cb = {
        .client_initial = ngtcp2_crypto_client_initial_cb,
        .recv_crypto_data = ngtcp2_crypto_recv_crypto_data_cb,
        .handshake_completed = handshake_completed,
        .encrypt = ngtcp2_crypto_encrypt_cb,
        .decrypt = ngtcp2_crypto_decrypt_cb,
        .hp_mask = ngtcp2_crypto_hp_mask_cb,
        .recv_stream_data = recv_stream_data,
        .acked_stream_data_offset = acked_stream_data_offset,
        .stream_close = stream_close,
        .recv_retry = ngtcp2_crypto_recv_retry_cb,
        .rand = rand_cb,
        .get_new_connection_id = get_new_connection_id,
        .update_key = ngtcp2_crypto_update_key_cb,
        .extend_max_stream_data = extend_max_stream_data,
        .delete_crypto_aead_ctx = ngtcp2_crypto_delete_crypto_aead_ctx_cb,
        .delete_crypto_cipher_ctx = ngtcp2_crypto_delete_crypto_cipher_ctx_cb,
        .get_path_challenge_data = ngtcp2_crypto_get_path_challenge_data_cb,
        .version_negotiation = ngtcp2_crypto_version_negotiation_cb,
    };
    ngtcp2_settings settings;
    ngtcp2_transport_params params;
    ngtcp2_cid dcid, scid;
    ngtcp2_path path = {
        {(ngtcp2_sockaddr *)&c->local, sizeof c->local},
        {(ngtcp2_sockaddr *)&c->remote, sizeof c->remote},
        NULL,
    };

    dcid.datalen = 18;
    gnutls_rnd(GNUTLS_RND_RANDOM, dcid.data, dcid.datalen);
    scid.datalen = 17;
    gnutls_rnd(GNUTLS_RND_RANDOM, scid.data, scid.datalen);
    ngtcp2_settings_default(&settings);
    settings.initial_ts = now_ns();
    settings.max_window = 2 * (uint64_t)WINDOW;
    settings.max_stream_window = 2 * (uint64_t)WINDOW;
    ngtcp2_transport_params_default(&params);
    params.initial_max_streams_uni = 3;
    params.initial_max_stream_data_bidi_local = WINDOW;
    params.initial_max_stream_data_uni = WINDOW;
    params.initial_max_data = WINDOW;
    params.max_idle_timeout = 30 * NGTCP2_SECONDS;
    if (ngtcp2_conn_client_new(&c->conn, &dcid, &scid, &path, NGTCP2_PROTO_VER_V1, &cb, &settings, &params,
                               NULL, c))
        die("ngtcp2_conn_client_new", "failed");
    ngtcp2_conn_set_tls_native_handle(c->conn, c->session);
}

/* ---- the loop ----------------------------------------------------------- */

static void send_packets(struct client *c)
{
    uint8_t buf[MAX_DATAGRAM];
    ngtcp2_path_storage ps;
    ngtcp2_pkt_info pi;

    ngtcp2_path_storage_zero(&ps);
    for (;;) {
        int64_t stream_id = -1;
        int fin = 0;
        nghttp3_vec vec[16];
        nghttp3_ssize nvec = 0;
        ngtcp2_ssize ndatalen = -1, nwrite;
        uint32_t flags = NGTCP2_WRITE_STREAM_FLAG_MORE;

        if (c->h3 && ngtcp2_conn_get_max_data_left(c->conn)) {
            nvec = nghttp3_conn_writev_stream(c->h3, &stream_id, &fin, vec, 16);
            if (nvec < 0)
                die("nghttp3_conn_writev_stream", nghttp3_strerror((int)nvec));
        }
        if (fin)
            flags |= NGTCP2_WRITE_STREAM_FLAG_FIN;
        nwrite = ngtcp2_conn_writev_stream(c->conn, &ps.path, &pi, buf, sizeof buf, &ndatalen, flags, stream_id,
                                           (const ngtcp2_vec *)vec, (size_t)nvec, now_ns());
        if (nwrite < 0) {
            switch (nwrite) {
            case NGTCP2_ERR_STREAM_DATA_BLOCKED:
                nghttp3_conn_block_stream(c->h3, stream_id);
                continue;
            case NGTCP2_ERR_STREAM_SHUT_WR:
                nghttp3_conn_shutdown_stream_write(c->h3, stream_id);
                continue;
            case NGTCP2_ERR_WRITE_MORE:
                if (nghttp3_conn_add_write_offset(c->h3, stream_id, (size_t)ndatalen))
                    die("nghttp3_conn_add_write_offset", "failed");
                continue;
            }
            die("ngtcp2_conn_writev_stream", ngtcp2_strerror((int)nwrite));
        }
        if (ndatalen >= 0 && nghttp3_conn_add_write_offset(c->h3, stream_id, (size_t)ndatalen))
            die("nghttp3_conn_add_write_offset", "failed");
        if (nwrite == 0)
            return;
        while (send(c->fd, buf, (size_t)nwrite, 0) < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                struct pollfd p = {c->fd, POLLOUT, 0};

                poll(&p, 1, 10);
                continue;
            }
            if (errno != EINTR)
                die("send", strerror(errno));
        }
    }
}

static void recv_packets(struct client *c)
{
    uint8_t buf[65536];
    ngtcp2_path path = {
        {(ngtcp2_sockaddr *)&c->local, sizeof c->local},
        {(ngtcp2_sockaddr *)&c->remote, sizeof c->remote},
        NULL,
    };
    ngtcp2_pkt_info pi = {0};

    for (;;) {
        ssize_t n = recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
        int rv;

        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            if (errno == EINTR)
                continue;
            die("recv", strerror(errno));
        }
        rv = ngtcp2_conn_read_pkt(c->conn, &path, &pi, buf, (size_t)n, now_ns());
        if (rv == NGTCP2_ERR_DRAINING || rv == NGTCP2_ERR_CLOSING) {
            c->done = 1;
            return;
        }
        if (rv != 0)
            die("ngtcp2_conn_read_pkt", ngtcp2_strerror(rv));
    }
}

static void close_connection(struct client *c)
{
    uint8_t buf[MAX_DATAGRAM];
    ngtcp2_path_storage ps;
    ngtcp2_pkt_info pi;
    ngtcp2_connection_close_error ccerr;
    ngtcp2_ssize n;

    ngtcp2_path_storage_zero(&ps);
    ngtcp2_connection_close_error_set_application_error(&ccerr, NGHTTP3_H3_NO_ERROR, NULL, 0);
    n = ngtcp2_conn_write_connection_close(c->conn, &ps.path, &pi, buf, sizeof buf, &ccerr, now_ns());
    if (n > 0 && send(c->fd, buf, (size_t)n, 0) < 0)
        fprintf(stderr, "h3client: sending the close: %s\n", strerror(errno));
}

int main(int argc, char **argv)
{
    struct client c = {.fd = -1, .request = -1};
    char authority[128], path[32];
    socklen_t len = sizeof c.local;
    uint64_t t0_ns, t0_tsc, t1_ns, t1_tsc;
    const char *work = getenv("QPROF_BULK_WORK");
    double seconds;
    int task_clock = -1;

    if (argc != 4) {
        fprintf(stderr, "usage: h3client ADDR PORT BYTES\n");
        return 2;
    }
    c.want = strtoull(argv[3], NULL, 10);
    c.passes = work ? atoi(work) : 0;
    if (c.passes)
        task_clock = open_task_clock();
    snprintf(authority, sizeof authority, "%s:%s", argv[1], argv[2]);
    snprintf(path, sizeof path, "/%llu", (unsigned long long)c.want);
    c.authority = authority;
    c.path = path;
    c.remote.sin_family = AF_INET;
    c.remote.sin_port = htons((uint16_t)atoi(argv[2]));
    if (inet_pton(AF_INET, argv[1], &c.remote.sin_addr) != 1)
        die(argv[1], "not an IPv4 address");
    c.fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (c.fd < 0 || connect(c.fd, (struct sockaddr *)&c.remote, sizeof c.remote) != 0 ||
        getsockname(c.fd, (struct sockaddr *)&c.local, &len) != 0)
        die("socket", strerror(errno));
    setup_tls(&c);
    setup_quic(&c);
    t0_ns = now_ns();
    t0_tsc = __rdtsc();
    send_packets(&c);
    while (!c.done) {
        ngtcp2_tstamp expiry = ngtcp2_conn_get_expiry(c.conn), now = now_ns();
        int timeout = expiry <= now ? 0 : (int)((expiry - now + 999999) / 1000000);
        struct pollfd p = {c.fd, POLLIN, 0};

        if (poll(&p, 1, timeout > 1000 ? 1000 : timeout) < 0 && errno != EINTR)
            die("poll", strerror(errno));
        recv_packets(&c);
        if (c.done)
            break;
        if (ngtcp2_conn_get_expiry(c.conn) <= now_ns()) {
            int rv = ngtcp2_conn_handle_expiry(c.conn, now_ns());

            if (rv != 0)
                die("ngtcp2_conn_handle_expiry", ngtcp2_strerror(rv));
        }
        send_packets(&c);
    }
    t1_ns = now_ns();
    t1_tsc = __rdtsc();
    seconds = (t1_ns - t0_ns) / 1e9;
    close_connection(&c);
    if (c.got != c.want) {
        fprintf(stderr, "h3client: received %llu bytes, expected %llu\n", (unsigned long long)c.got,
                (unsigned long long)c.want);
        return 1;
    }
    if (c.passes) {
        double tsc_per_s = (double)(t1_tsc - t0_tsc) / seconds;
        uint64_t timing = c.work_calls * bracket_cycles();
        double work_cycles = c.work_cycles > timing ? (double)(c.work_cycles - timing) : 0.0;

        printf("bytes=%llu seconds=%.3f work_seconds=%.6f cpu_seconds=%.6f checksum=%llx\n",
               (unsigned long long)c.got, seconds, work_cycles / tsc_per_s, task_clock_seconds(task_clock),
               (unsigned long long)c.sink);
    } else {
        printf("bytes=%llu seconds=%.3f\n", (unsigned long long)c.got, seconds);
    }
    nghttp3_conn_del(c.h3);
    ngtcp2_conn_del(c.conn);
    gnutls_deinit(c.session);
    gnutls_certificate_free_credentials(c.cred);
    close(c.fd);
    return 0;
}
