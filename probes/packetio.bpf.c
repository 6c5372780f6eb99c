// SPDX-License-Identifier: GPL-2.0
// qprof default probes: UDP packet I/O, GSO/GRO, drops (libbpf, CO-RE, BTF tracepoints).
//
// Why tp_btf and not bpftrace's tracepoints: a classic tracepoint builds its
// trace record and enters the perf tracepoint path for EVERY task before the
// program can test the pid; a BTF tracepoint calls the program directly with
// the raw arguments. These events fire once per datagram for every process on
// the host (the untargeted peer of a loopback transfer receives ~1M datagrams
// a GiB). Measured here with a send+recv loop of 1200-byte datagrams over
// loopback and four such events per iteration, all for another pid: +250 ns
// an iteration with bpftrace tracepoints, +40 ns with these programs.
// kprobes/fentry would be cheaper still but are unavailable on qprof's kernels.
//
// Counters are per-CPU (no atomics on the hot path) and summed by the loader
// (probes/libbpf.py), which prints them in bpftrace's JSON map format.

#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#define MAX_TARGETS 16
#define IPPROTO_UDP_ 17
#define ETH_P_IP_ 0x0800
#define ETH_P_IPV6_ 0x86DD

// Set by the loader before load (read-only data: the verifier sees constants). The only
// read-only variable, so its layout is the .rodata section's (probes/packetio.py packs it).
struct config {
	__u32 targets[MAX_TARGETS];  // tgids
	__u32 ntargets;
	__u32 gro_bit;               // UDP_FLAGS_GRO_ENABLED in udp_sock.udp_flags (from BTF)
};
const volatile struct config cfg = {};

struct thread_key { __u32 pid, tid; };
struct thread_counts {
	__u64 tx_bytes, tx_errors, tx_gso_sockopt_msgs;
	__u64 rx_bytes, rx_empty, rx_gro_socket_msgs;
	__u64 tx_skbs, tx_gso_skbs, tx_dgrams;
	__u64 rx_gro_skbs, rx_gro_dgrams;
};
struct port_key { __u32 pid, tid, port, dir; };   // dir: 0 tx, 1 rx
struct hist_key { __u32 pid, hist, bucket, pad; };  // hist: HIST_* below
struct pair_key { __s32 a; __u32 b; };

enum { HIST_TX_GSO_SEGS, HIST_TX_GSO_SIZE, HIST_RX_GRO_SEGS };

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct thread_key);
	__type(value, struct thread_counts);
} threads SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct port_key);
	__type(value, __u64);
} msgs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct hist_key);
	__type(value, __u64);
} hists SEC(".maps");

// host-wide drops: rare in a healthy run, so plain hashes with atomic adds
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct pair_key);   // reason, protocol
	__type(value, __u64);
} drops SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct pair_key);   // reason, destination port
	__type(value, __u64);
} udp_drops SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct pair_key);   // rc, local port
	__type(value, __u64);
} udp_queue_fail SEC(".maps");

// The first test of every hot program: is the current task one of ours?
static __always_inline int is_target(__u64 pid_tgid)
{
	__u32 tgid = pid_tgid >> 32;
	for (int i = 0; i < MAX_TARGETS; i++) {
		if (i >= cfg.ntargets)
			return 0;
		if (cfg.targets[i] == tgid)
			return 1;
	}
	return 0;
}

static __always_inline struct thread_counts *thread(__u64 pid_tgid)
{
	struct thread_key k = { .pid = pid_tgid >> 32, .tid = (__u32)pid_tgid };
	struct thread_counts *c = bpf_map_lookup_elem(&threads, &k);
	if (c)
		return c;
	struct thread_counts zero = {};
	bpf_map_update_elem(&threads, &k, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&threads, &k);
}

static __always_inline void add(void *map, void *key, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(map, key);
	if (v) {
		*v += n;   // per-CPU value
		return;
	}
	bpf_map_update_elem(map, key, &n, BPF_NOEXIST);
}

static __always_inline void add_shared(void *map, void *key)
{
	__u64 one = 1, *v = bpf_map_lookup_elem(map, key);
	if (v)
		__sync_fetch_and_add(v, 1);
	else
		bpf_map_update_elem(map, key, &one, BPF_NOEXIST);
}

static __always_inline void hist(__u32 pid, __u32 which, __u64 value, __u32 step, __u32 nbuckets)
{
	__u32 b = value / step;
	struct hist_key k = { .pid = pid, .hist = which, .bucket = b < nbuckets ? b : nbuckets };
	add(&hists, &k, 1);
}

static __always_inline void count_msg(__u64 pid_tgid, struct sock *sk, __u32 dir)
{
	struct port_key k = { .pid = pid_tgid >> 32, .tid = (__u32)pid_tgid,
			      .port = BPF_CORE_READ(sk, __sk_common.skc_num), .dir = dir };
	add(&msgs, &k, 1);
}

// ---- messages and bytes, per thread: one event per UDP message (also inside sendmmsg/recvmmsg)
SEC("tp_btf/sock_send_length")
int BPF_PROG(send_length, struct sock *sk, int ret, int flags)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!is_target(id) || BPF_CORE_READ(sk, sk_protocol) != IPPROTO_UDP_)
		return 0;
	struct thread_counts *c = thread(id);
	if (!c)
		return 0;
	if (ret < 0) {
		c->tx_errors++;
		return 0;
	}
	count_msg(id, sk, 0);
	c->tx_bytes += ret;
	if (BPF_CORE_READ((struct udp_sock *)sk, gso_size) > 0)
		c->tx_gso_sockopt_msgs++;   // UDP_SEGMENT set on the socket
	return 0;
}

SEC("tp_btf/sock_recv_length")
int BPF_PROG(recv_length, struct sock *sk, int ret, int flags)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!is_target(id) || (flags & 2 /* MSG_PEEK */) || BPF_CORE_READ(sk, sk_protocol) != IPPROTO_UDP_)
		return 0;
	struct thread_counts *c = thread(id);
	if (!c)
		return 0;
	if (ret <= 0) {
		c->rx_empty++;   // EAGAIN and errors: a receive that found nothing
		return 0;
	}
	count_msg(id, sk, 1);
	c->rx_bytes += ret;
	if (bpf_core_field_exists(((struct udp_sock *)sk)->udp_flags) &&
	    (BPF_CORE_READ((struct udp_sock *)sk, udp_flags) & (1UL << cfg.gro_bit)))
		c->rx_gro_socket_msgs++;
	return 0;
}

static __always_inline struct skb_shared_info *shinfo(const struct sk_buff *skb)
{
	return (struct skb_shared_info *)(BPF_CORE_READ(skb, head) + BPF_CORE_READ(skb, end));
}

// ---- what the kernel did on transmit: one event per skb handed to a device
SEC("tp_btf/net_dev_start_xmit")
int BPF_PROG(start_xmit, const struct sk_buff *skb, const struct net_device *dev)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!is_target(id))
		return 0;
	struct sock *sk = BPF_CORE_READ(skb, sk);
	if (!sk || BPF_CORE_READ(sk, sk_protocol) != IPPROTO_UDP_)
		return 0;
	struct thread_counts *c = thread(id);
	if (!c)
		return 0;
	struct skb_shared_info *sh = shinfo(skb);
	__u16 gso_size = BPF_CORE_READ(sh, gso_size);
	c->tx_skbs++;
	if (gso_size > 0) {
		__u16 segs = BPF_CORE_READ(sh, gso_segs);
		c->tx_gso_skbs++;
		c->tx_dgrams += segs;
		hist(id >> 32, HIST_TX_GSO_SEGS, segs, 4, 20);
		hist(id >> 32, HIST_TX_GSO_SIZE, gso_size, 250, 36);
	} else {
		c->tx_dgrams++;
	}
	return 0;
}

// ---- GRO on receive: coalesced skbs are copied with skb_copy_datagram_iter (linear single
// datagrams take a shortcut without this tracepoint, so only GRO skbs are counted here)
SEC("tp_btf/skb_copy_datagram_iovec")
int BPF_PROG(copy_datagram, const struct sk_buff *skb, int len)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!is_target(id))
		return 0;
	__u16 segs = BPF_CORE_READ(shinfo(skb), gso_segs);
	if (segs <= 1)
		return 0;
	// UDP receive skbs carry no socket pointer here: test the IP header's protocol
	unsigned char *nh = BPF_CORE_READ(skb, head) + BPF_CORE_READ(skb, network_header);
	__u16 proto = bpf_ntohs(BPF_CORE_READ(skb, protocol));
	__u8 l4 = 0;
	if (proto == ETH_P_IP_)
		l4 = BPF_CORE_READ((struct iphdr *)nh, protocol);
	else if (proto == ETH_P_IPV6_)
		l4 = BPF_CORE_READ((struct ipv6hdr *)nh, nexthdr);
	if (l4 != IPPROTO_UDP_)
		return 0;
	struct thread_counts *c = thread(id);
	if (!c)
		return 0;
	c->rx_gro_skbs++;
	c->rx_gro_dgrams += segs;
	hist(id >> 32, HIST_RX_GRO_SEGS, segs, 4, 20);
	return 0;
}

// ---- drops, host-wide; UDP ones keyed by destination port (matched to the targets' later)
SEC("tp_btf/kfree_skb")
int BPF_PROG(free_skb, struct sk_buff *skb, void *location, enum skb_drop_reason reason)
{
	__u16 proto = bpf_ntohs(BPF_CORE_READ(skb, protocol));
	struct pair_key k = { .a = reason, .b = proto };
	add_shared(&drops, &k);
	if (proto != ETH_P_IP_)
		return 0;
	unsigned char *head = BPF_CORE_READ(skb, head);
	struct iphdr *iph = (struct iphdr *)(head + BPF_CORE_READ(skb, network_header));
	if (BPF_CORE_READ(iph, protocol) != IPPROTO_UDP_)
		return 0;
	struct udphdr *uh = (struct udphdr *)(head + BPF_CORE_READ(skb, transport_header));
	struct pair_key u = { .a = reason, .b = bpf_ntohs(BPF_CORE_READ(uh, dest)) };
	add_shared(&udp_drops, &u);
	return 0;
}

SEC("tp_btf/udp_fail_queue_rcv_skb")
int BPF_PROG(fail_queue, int rc, struct sock *sk)
{
	struct pair_key k = { .a = rc, .b = BPF_CORE_READ(sk, __sk_common.skc_num) };
	add_shared(&udp_queue_fail, &k);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
