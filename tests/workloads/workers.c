// A server with a worker process per core behind SO_REUSEPORT, and a sender of many flows, with exact
// ground truth for following a service's workers.
//
//   workers serve N              a master forks N workers, each binding 127.0.0.1:PORT with
//                                SO_REUSEPORT (PORT: the first worker's, printed as "port PORT"
//                                once all are bound); a worker receives datagrams and hashes each
//                                one (CPU for perf to sample); a worker that exits is replaced at
//                                once ("replaced OLD NEW"); on SIGTERM the master stops the workers
//                                and each prints "worker PID DATAGRAMS BYTES" as it exits
//   workers send PORT SECONDS RATE FLOWS   FLOWS sockets (source ports: the kernel spreads them over
//                                the workers) sending 1200-byte datagrams in turn, RATE a second in
//                                all, for SECONDS; prints "sent DATAGRAMS BYTES"
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SIZE 1200
#define MAX_WORKERS 64

static volatile sig_atomic_t stop;
static int probe = -1;  // the master's first socket: only there to choose the port

static void on_term(int sig)
{
	(void)sig;
	stop = 1;
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static int bound(int port)
{
	int s = socket(AF_INET, SOCK_DGRAM, 0), one = 1, rcvbuf = 4 << 20;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
				.sin_port = htons(port)};
	socklen_t len = sizeof a;
	setsockopt(s, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
	setsockopt(s, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
	if (bind(s, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(s, (struct sockaddr *)&a, &len) != 0) {
		perror("bind");
		exit(1);
	}
	return s;
}

// Work per datagram, in a function of its own so that samples name it.
__attribute__((noinline)) static uint64_t digest(const unsigned char *p, size_t n)
{
	uint64_t h = 1469598103934665603ull;
	for (int round = 0; round < 8; round++)
		for (size_t i = 0; i < n; i++)
			h = (h ^ p[i]) * 1099511628211ull;
	return h;
}

static void worker(int s)
{
	struct sigaction sa = {.sa_handler = on_term};
	sigaction(SIGTERM, &sa, NULL);  // no SA_RESTART: recv returns EINTR
	static unsigned char buf[65536];
	unsigned long long dgrams = 0, bytes = 0;
	volatile uint64_t sink = 0;
	while (!stop) {
		ssize_t n = recv(s, buf, sizeof buf, 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			perror("recv");
			exit(1);
		}
		dgrams++;
		bytes += n;
		sink += digest(buf, n);
	}
	printf("worker %d %llu %llu\n", getpid(), dgrams, bytes);
	fflush(stdout);
	exit(0);
}

static pid_t spawn(int port, int ready_fd)
{
	pid_t p = fork();
	if (p == 0) {
		if (probe >= 0)
			close(probe);  // else the port's group keeps a socket nobody reads
		int s = bound(port);
		if (ready_fd >= 0 && write(ready_fd, "x", 1) != 1)
			exit(1);
		worker(s);
	}
	return p;
}

static int serve(int n)
{
	if (n < 1 || n > MAX_WORKERS)
		return fprintf(stderr, "1 to %d workers\n", MAX_WORKERS), 2;
	struct sigaction sa = {.sa_handler = on_term};
	sigaction(SIGTERM, &sa, NULL);
	// the port: bound once here (SO_REUSEPORT) so that every worker binds the same one, then closed
	probe = bound(0);
	struct sockaddr_in a;
	socklen_t len = sizeof a;
	getsockname(probe, (struct sockaddr *)&a, &len);
	int port = ntohs(a.sin_port);
	int ready[2];
	if (pipe(ready) != 0)
		return perror("pipe"), 1;
	pid_t kids[MAX_WORKERS];
	for (int i = 0; i < n; i++)
		kids[i] = spawn(port, ready[1]);
	char c;
	for (int i = 0; i < n; i++)
		if (read(ready[0], &c, 1) != 1)
			return perror("ready"), 1;
	close(probe);  // the workers hold the port now: no datagram goes to the master
	probe = -1;
	printf("port %d\n", port);
	fflush(stdout);
	while (!stop) {
		int status;
		pid_t dead = waitpid(-1, &status, 0);
		if (dead < 0) {
			if (errno == EINTR)
				continue;
			return perror("waitpid"), 1;
		}
		for (int i = 0; i < n; i++)
			if (kids[i] == dead && !stop) {
				kids[i] = spawn(port, -1);
				printf("replaced %d %d\n", dead, kids[i]);
				fflush(stdout);
			}
	}
	for (int i = 0; i < n; i++)
		kill(kids[i], SIGTERM);
	while (wait(NULL) > 0 || errno == EINTR)
		;
	return 0;
}

static int send_flows(int port, double seconds, double rate, int flows)
{
	if (flows < 1 || flows > 1024 || rate <= 0)
		return fprintf(stderr, "1 to 1024 flows at a rate > 0\n"), 2;
	int *s = calloc(flows, sizeof *s);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
				.sin_port = htons(port)};
	for (int i = 0; i < flows; i++) {
		s[i] = socket(AF_INET, SOCK_DGRAM, 0);
		if (connect(s[i], (struct sockaddr *)&a, sizeof a) != 0)
			return perror("connect"), 1;
	}
	static unsigned char buf[SIZE];
	unsigned long long dgrams = 0, bytes = 0;
	double t0 = now(), gap = 1.0 / rate;
	for (unsigned long long k = 0;; k++) {
		double due = t0 + k * gap, t = now();
		if (t - t0 >= seconds)
			break;
		if (due > t) {
			struct timespec d = {0, (long)((due - t) * 1e9)};
			nanosleep(&d, NULL);
		}
		buf[0] = (unsigned char)k;
		if (send(s[k % flows], buf, SIZE, 0) == SIZE) {
			dgrams++;
			bytes += SIZE;
		}
	}
	printf("sent %llu %llu\n", dgrams, bytes);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "serve") == 0)
		return serve(atoi(argv[2]));
	if (argc == 6 && strcmp(argv[1], "send") == 0)
		return send_flows(atoi(argv[2]), atof(argv[3]), atof(argv[4]), atoi(argv[5]));
	fprintf(stderr, "usage: workers serve N | workers send PORT SECONDS RATE FLOWS\n");
	return 2;
}
