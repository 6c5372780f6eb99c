// A UDP stream over loopback with exact ground truth for the packet I/O probes.
//
//   udp_stream sink [gro] [SENDERS]       bind 127.0.0.1:0 (4 MiB SO_RCVBUF, UDP_GRO if asked), print
//                                         the port, receive with one recvmsg per call until the
//                                         1-byte end markers of SENDERS senders (default 1), print
//                                         "datagrams bytes calls" (a sink gone early refuses the
//                                         other senders' datagrams)
//   udp_stream send PORT SECONDS SIZE SEGS [RATE]   send SIZE-byte datagrams for SECONDS, SEGS per
//                                         sendmsg (UDP_SEGMENT when SEGS > 1), as fast as it can or
//                                         RATE sends a second, then the end marker; print
//                                         "datagrams bytes calls" (the marker not counted)
// Both print their own counts: what the kernel was asked to move, datagram by datagram.
#include <errno.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static int sink(int gro, int senders)
{
	int s = socket(AF_INET, SOCK_DGRAM, 0), one = 1, rcvbuf = 4 << 20;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof a;
	setsockopt(s, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
	if (gro && setsockopt(s, IPPROTO_UDP, UDP_GRO, &one, sizeof one) != 0)
		return perror("UDP_GRO"), 1;
	if (bind(s, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(s, (struct sockaddr *)&a, &len) != 0)
		return perror("bind"), 1;
	printf("%d\n", ntohs(a.sin_port));
	fflush(stdout);
	static char buf[65536];
	char ctl[CMSG_SPACE(sizeof(int))];
	unsigned long long dgrams = 0, bytes = 0, calls = 0;
	for (;;) {
		struct iovec iov = {buf, sizeof buf};
		struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
		ssize_t n = recvmsg(s, &m, 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return perror("recvmsg"), 1;
		}
		if (n == 1) {
			if (--senders > 0)
				continue;
			break;
		}
		int seg = 0;
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
			if (c->cmsg_level == IPPROTO_UDP && c->cmsg_type == UDP_GRO)
				memcpy(&seg, CMSG_DATA(c), sizeof seg);
		calls++;
		bytes += n;
		dgrams += seg > 0 ? (n + seg - 1) / seg : 1;
	}
	printf("%llu %llu %llu\n", dgrams, bytes, calls);
	return 0;
}

static int send_stream(int port, double seconds, int size, int segs, double rate)
{
	int s = socket(AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
				.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	if (connect(s, (struct sockaddr *)&a, sizeof a) != 0)
		return perror("connect"), 1;
	if (segs > 1 && setsockopt(s, IPPROTO_UDP, UDP_SEGMENT, &size, sizeof size) != 0)
		return perror("UDP_SEGMENT"), 1;
	char *buf = calloc(segs, size);
	unsigned long long dgrams = 0, bytes = 0, calls = 0;
	double start = now(), end = start + seconds, due = start;
	while (now() < end) {
		if (rate > 0) {  // paced: one send at its time
			double t = now();
			if (due > t)
				usleep((useconds_t)((due - t) * 1e6));
			else if (due < t - 1 / rate)
				due = t;  // behind (not scheduled for a while): no burst to catch up, the rate goes on from now
			due += 1 / rate;
		}
		for (int i = 0; i < (rate > 0 ? 1 : 64); i++) {
			ssize_t n = send(s, buf, (size_t)size * segs, 0);
			if (n < 0) {
				if (errno == ENOBUFS || errno == EAGAIN || errno == ECONNREFUSED)
					continue;
				return perror("send"), 1;
			}
			calls++;
			bytes += n;
			dgrams += segs;
		}
		usleep(0);
	}
	int zero = 0;
	setsockopt(s, IPPROTO_UDP, UDP_SEGMENT, &zero, sizeof zero);
	usleep(200000);  // let the sink drain before the marker
	send(s, "x", 1, 0);
	printf("%llu %llu %llu\n", dgrams, bytes, calls);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 2 && !strcmp(argv[1], "sink")) {
		int gro = 0, senders = 1;
		for (int i = 2; i < argc; i++) {
			if (!strcmp(argv[i], "gro"))
				gro = 1;
			else if ((senders = atoi(argv[i])) < 1)
				break;
		}
		if (senders >= 1)
			return sink(gro, senders);
	}
	if ((argc == 6 || argc == 7) && !strcmp(argv[1], "send"))
		return send_stream(atoi(argv[2]), atof(argv[3]), atoi(argv[4]), atoi(argv[5]),
				   argc == 7 ? atof(argv[6]) : 0.0);
	fprintf(stderr, "usage: udp_stream sink [gro] [SENDERS] | udp_stream send PORT SECONDS SIZE SEGS [RATE]\n");
	return 2;
}
