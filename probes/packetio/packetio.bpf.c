// SPDX-License-Identifier: GPL-2.0
// qprof default probes: UDP packet I/O, GSO/GRO, drops (libbpf, CO-RE, BTF tracepoints).
//
// Cost is the design constraint. On qprof's test VM every event that fires an attached
// tracepoint costs its task ~80 ns before any program code runs (dispatch plus the CPU's
// speculative-execution mitigations), whoever the task is; a 1 GiB ngtcp2 download fires
// the four per-packet hooks below ~2 million times. So:
//  - the per-packet programs are attached only during short sampling windows, chosen by
//    the loader (probes/packetio/sampler.py) to keep the hook rate within a CPU budget;
//    `ctl.gate` brackets each window exactly, so counts in a window and the kernel's UDP
//    counters read around it cover the same time (the estimator's ratio needs that);
//  - inside a program: the target test first (constants in .rodata), direct BTF reads
//    (no bpf_probe_read_kernel calls), and per-thread counts kept in a per-CPU slot that is
//    flushed to the hash only when another thread runs on that CPU (a hash lookup per event
//    cost ~85 ns here, the slot a few);
//  - the drop programs stay attached (drops are rare) and count only drops at ports the
//    targets' sockets hold: nothing a target does not cause is counted or charged to it.
//
// kprobes/fentry would be cheaper still but are unavailable on qprof's kernels.

#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#define MAX_TARGETS 4096     // target processes: a worker per core on the largest hosts, with room
#define TIMED_TARGETS 16     // the first targets get their messages' times binned (the ring: 64 KiB each;
                             // a power of two)
#define HIST_TARGETS 64      // ... and GSO/GRO histograms (per CPU: 1 KiB each); every target is counted
#define MAX_NETNS 256
#define SCAN_TARGETS 16      // up to this many targets are found by scanning cfg.first (a few compares)
#define TGID_WORDS 65536     // 2^22 tgids as bits: PID_MAX_LIMIT on 64-bit
#define PORT_WORDS 1024      // 65536 ports as bits
#define HIST_BUCKETS 40      // buckets before the overflow bucket
#define IPPROTO_UDP_ 17
#define ETH_P_IP_ 0x0800
#define ETH_P_IPV6_ 0x86DD
#define MSG_PEEK_ 2
#define TIMING_SHIFT 17      // timing bins of 2^17 ns (0.13 ms) of CLOCK_MONOTONIC
#define TIMING_BINS 8192     // a ring of 1.07 s: the loader drains it every period (<= 0.5 s)

extern void *bpf_rdonly_cast(const void *obj, __u32 btf_id) __ksym;
#define CAST(ptr, type) ((type *)bpf_rdonly_cast((void *)(ptr), bpf_core_type_id_kernel(type)))

// Set by the loader before load: the verifier sees constants.
struct config {
	__u32 first[SCAN_TARGETS];   // the targets' tgids, when there are at most SCAN_TARGETS
	__u32 ntargets;
	__u32 gro_bit;               // UDP_FLAGS_GRO_ENABLED in udp_sock.udp_flags (from BTF)
	__u32 nnetns;                // the targets' network namespaces, in target_netns (0: not known, all counted)
	__u32 follow;                // targets grow during the run (their new processes, pids the loader adds):
	                             // every test goes through the bits and the hash, cfg.first is not used
};
const volatile struct config cfg = {};
// What this object holds (the loader reads them from .rodata)
const volatile struct limits { __u32 targets, timed, hists, netns; } limits = {
	MAX_TARGETS, TIMED_TARGETS, HIST_TARGETS, MAX_NETNS };

// More targets than SCAN_TARGETS: their tgids as bits (.bss, set by the loader before it attaches),
// the test every event starts with, two loads (the host's other tasks stop here); a target's index
// is then looked up.
struct watch { __u64 tgids[TGID_WORDS]; };
struct watch watch = {};

// Targets added while the programs run (follow): the indexes not yet handed out (the loader fills
// the queue before it attaches), taken by the fork program and the loader's add_target call alike
// (a pop is atomic: no two targets share an index), and who added each index.
struct {
	__uint(type, BPF_MAP_TYPE_QUEUE);
	__uint(max_entries, MAX_TARGETS);
	__type(value, __u32);
} free_slots SEC(".maps");

struct follow {
	__u64 refused;               // targets not added: every index was taken
	__u32 parent[MAX_TARGETS];   // by index: the tgid that forked it (0: a start target, or added by pid)
};
struct follow follow = {};

// tgid -> its index among the targets (the loader's order, then the order they were added in)
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_TARGETS);
	__type(key, __u32);
	__type(value, __u32);
} target_slot SEC(".maps");

// the targets' network namespaces (inode numbers): drops elsewhere are not theirs
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_NETNS);
	__type(key, __u32);
	__type(value, __u32);
} target_netns SEC(".maps");

// Written by the loader while the programs run (the .bss map is mmapped).
struct control {
	__u32 gate;                  // 1 while a sampling window is open
	__u32 timing;                // 1 while the window is long enough for a round trip: the messages' times are binned
	__u64 ports[PORT_WORDS];     // local ports of the targets' UDP sockets, for the drop programs
};
struct control ctl = {};

// Messages sent and received per target and timing bin (index: the bin's number mod TIMING_BINS).
// The round trip shows in them: what a side sends comes back acknowledged (or answered) one path
// round trip later (attribution/rtt.py). Binned only in windows of 20 ms or more (the loader sets
// the flag, probes/packetio/timing.py): a clock read and an add per message; a fast transfer's
// short windows pay nothing.
struct timing { __u32 n[TIMED_TARGETS][2][TIMING_BINS]; };
struct timing tim = {};
const volatile struct timing_cfg { __u32 shift; } timing_cfg = { TIMING_SHIFT };

static __always_inline void tick(int t, int dir)
{
	__u64 row = (__u32)t;
	asm volatile("" : "+r"(row));  // one register, checked where it is used (a hash's index is unbounded)
	if (!ctl.timing || row >= TIMED_TARGETS)
		return;
	__u32 b = (bpf_ktime_get_ns() >> TIMING_SHIFT) & (TIMING_BINS - 1);
	__sync_fetch_and_add(&tim.n[row][dir & 1][b], 1);
}

// Everything counted per thread. The loader reads the field names and offsets from this
// object's BTF: this definition is the only one.
struct counts {
	__u64 tx_msgs, tx_bytes, tx_errors, tx_gso_sockopt_msgs;
	__u64 tx_skbs, tx_gso_skbs, tx_dgrams;
	__u64 rx_msgs, rx_bytes, rx_empty, rx_gro_socket_msgs;
	__u64 rx_gro_skbs, rx_gro_dgrams;
};
struct thread_key { __u32 pid, tid; };
struct slot { struct thread_key key; struct counts c; };
// per target: datagrams per GSO send, GSO segment size, datagrams per GRO receive
struct hists { __u64 tx_gso_segs[HIST_BUCKETS + 1], tx_gso_size[HIST_BUCKETS + 1], rx_gro_segs[HIST_BUCKETS + 1]; };
struct events { __u64 send, recv, xmit, copy; };  // hook runs while the gate was open, any task
struct pair_key { __s32 a; __u32 b; };
// their bucket widths (the loader reads them from this object's .rodata)
const volatile struct hist_steps { __u32 tx_gso_segs, tx_gso_size, rx_gro_segs; } steps = { 4, 250, 4 };

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct thread_key);
	__type(value, struct counts);
} threads SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct slot);
} slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct events);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, HIST_TARGETS);
	__type(key, __u32);
	__type(value, struct hists);
} hists SEC(".maps");

// port -> the target that first used it (ports of sockets opened after the loader's last look)
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u32);
} port_owner SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 1024);
	__type(key, struct pair_key);   // drop reason, local port
	__type(value, __u64);
} udp_drops SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 1024);
	__type(key, struct pair_key);   // rc, local port
	__type(value, __u64);
} udp_queue_fail SEC(".maps");

// Index of the current task's process among the targets, or -1. A few targets (the usual server
// and client) are scanned for, as cheap as a test can be; more go through the bits and the hash
// (measured 2026-11-27: +19 ns a program run for two targets had they gone that way).
static __always_inline int target_index(__u64 pid_tgid)
{
	__u32 tgid = pid_tgid >> 32;
	if (!cfg.follow && cfg.ntargets <= SCAN_TARGETS) {
		for (int i = 0; i < SCAN_TARGETS; i++) {
			if (i >= cfg.ntargets)
				return -1;
			if (cfg.first[i] == tgid)
				return i;
		}
		return -1;
	}
	if (!((watch.tgids[(tgid >> 6) & (TGID_WORDS - 1)] >> (tgid & 63)) & 1))
		return -1;
	__u32 *i = bpf_map_lookup_elem(&target_slot, &tgid);
	return i ? (int)*i : -1;
}

static __always_inline struct events *open_window(void)
{
	__u32 zero = 0;
	if (!ctl.gate)
		return 0;
	return bpf_map_lookup_elem(&events, &zero);
}

static __always_inline void flush(struct slot *s)
{
	struct counts *v = bpf_map_lookup_elem(&threads, &s->key);
	if (!v) {
		bpf_map_update_elem(&threads, &s->key, &s->c, BPF_NOEXIST);
	} else {
		__u64 *dst = (__u64 *)v, *src = (__u64 *)&s->c;
#pragma unroll
		for (int i = 0; i < sizeof(struct counts) / 8; i++)
			dst[i] += src[i];
	}
	__builtin_memset(&s->c, 0, sizeof(s->c));
}

// This thread's counts: the CPU's slot, flushed first if another thread left counts in it.
static __always_inline struct counts *mine(__u64 pid_tgid)
{
	__u32 zero = 0;
	struct slot *s = bpf_map_lookup_elem(&slots, &zero);
	if (!s)
		return 0;
	__u32 pid = pid_tgid >> 32, tid = (__u32)pid_tgid;
	if (s->key.tid != tid || s->key.pid != pid) {
		if (s->key.pid)
			flush(s);
		s->key.pid = pid;
		s->key.tid = tid;
	}
	return &s->c;
}

static __always_inline int port_watched(__u32 port)
{
	return (ctl.ports[(port >> 6) & (PORT_WORDS - 1)] >> (port & 63)) & 1;
}

// A target's socket port, for the drop programs: set on first sight (rare after that).
static __always_inline void note_port(__u32 port, __u32 pid)
{
	if (!port || port_watched(port))
		return;
	__sync_fetch_and_or(&ctl.ports[(port >> 6) & (PORT_WORDS - 1)], 1ULL << (port & 63));
	bpf_map_update_elem(&port_owner, &port, &pid, BPF_NOEXIST);
}

#define HIST(target, name, value) do {						\
	__u32 t_ = (target);							\
	struct hists *h_ = bpf_map_lookup_elem(&hists, &t_);			\
	if (h_) {								\
		__u64 b_ = (value) / steps.name;				\
		h_->name[b_ < HIST_BUCKETS ? b_ : HIST_BUCKETS]++;		\
	}									\
} while (0)

static __always_inline struct skb_shared_info *shinfo(const struct sk_buff *skb)
{
	return CAST(skb->head + skb->end, struct skb_shared_info);
}

// ---- messages and bytes, per thread: one event per UDP message (also inside sendmmsg/recvmmsg)
SEC("tp_btf/sock_send_length")
int BPF_PROG(send_length, struct sock *sk, int ret, int flags)
{
	struct events *ev = open_window();
	if (!ev)
		return 0;
	ev->send++;
	__u64 id = bpf_get_current_pid_tgid();
	int t = target_index(id);
	if (t < 0 || sk->sk_protocol != IPPROTO_UDP_)
		return 0;
	struct counts *c = mine(id);
	if (!c)
		return 0;
	if (ret < 0) {
		c->tx_errors++;
		return 0;
	}
	c->tx_msgs++;
	c->tx_bytes += ret;
	tick(t, 0);
	note_port(sk->__sk_common.skc_num, id >> 32);
	if (CAST(sk, struct udp_sock)->gso_size > 0)
		c->tx_gso_sockopt_msgs++;   // UDP_SEGMENT set on the socket
	return 0;
}

SEC("tp_btf/sock_recv_length")
int BPF_PROG(recv_length, struct sock *sk, int ret, int flags)
{
	struct events *ev = open_window();
	if (!ev)
		return 0;
	ev->recv++;
	__u64 id = bpf_get_current_pid_tgid();
	int t = target_index(id);
	if (t < 0 || (flags & MSG_PEEK_) || sk->sk_protocol != IPPROTO_UDP_)
		return 0;
	struct counts *c = mine(id);
	if (!c)
		return 0;
	if (ret <= 0) {
		c->rx_empty++;   // EAGAIN and errors: a receive that found nothing
		return 0;
	}
	c->rx_msgs++;
	c->rx_bytes += ret;
	tick(t, 1);
	note_port(sk->__sk_common.skc_num, id >> 32);
	struct udp_sock *up = CAST(sk, struct udp_sock);
	if (bpf_core_field_exists(up->udp_flags) && (up->udp_flags & (1UL << cfg.gro_bit)))
		c->rx_gro_socket_msgs++;
	return 0;
}

// ---- what the kernel did on transmit: one event per skb handed to a device
SEC("tp_btf/net_dev_start_xmit")
int BPF_PROG(start_xmit, const struct sk_buff *skb, const struct net_device *dev)
{
	struct events *ev = open_window();
	if (!ev)
		return 0;
	ev->xmit++;
	__u64 id = bpf_get_current_pid_tgid();
	int t = target_index(id);
	if (t < 0)
		return 0;
	struct sock *sk = skb->sk;
	if (!sk || sk->sk_protocol != IPPROTO_UDP_)
		return 0;
	struct counts *c = mine(id);
	if (!c)
		return 0;
	struct skb_shared_info *sh = shinfo(skb);
	__u16 gso_size = sh->gso_size;
	c->tx_skbs++;
	if (gso_size > 0) {
		__u16 segs = sh->gso_segs;
		c->tx_gso_skbs++;
		c->tx_dgrams += segs;
		HIST(t, tx_gso_segs, segs);
		HIST(t, tx_gso_size, gso_size);
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
	struct events *ev = open_window();
	if (!ev)
		return 0;
	ev->copy++;
	__u64 id = bpf_get_current_pid_tgid();
	int t = target_index(id);
	if (t < 0)
		return 0;
	__u16 segs = shinfo(skb)->gso_segs;
	if (segs <= 1)
		return 0;
	// UDP receive skbs carry no socket pointer here: test the IP header's protocol
	unsigned char *nh = skb->head + skb->network_header;
	__u16 proto = bpf_ntohs(skb->protocol);
	__u8 l4 = 0;
	if (proto == ETH_P_IP_)
		l4 = CAST(nh, struct iphdr)->protocol;
	else if (proto == ETH_P_IPV6_)
		l4 = CAST(nh, struct ipv6hdr)->nexthdr;
	if (l4 != IPPROTO_UDP_)
		return 0;
	struct counts *c = mine(id);
	if (!c)
		return 0;
	c->rx_gro_skbs++;
	c->rx_gro_dgrams += segs;
	HIST(t, rx_gro_segs, segs);
	return 0;
}

// ---- drops at the targets' ports, with the kernel's reason (always attached: drops are rare)

static __always_inline void count_pair(void *map, __s32 a, __u32 b)
{
	struct pair_key k = { .a = a, .b = b };
	__u64 one = 1, *v = bpf_map_lookup_elem(map, &k);
	if (v)
		*v += 1;   // per-CPU value
	else
		bpf_map_update_elem(map, &k, &one, BPF_NOEXIST);
}

// Destination port of a UDP datagram from its headers (0 when it is not one).
static __always_inline __u32 udp_dest_port(const struct sk_buff *skb)
{
	unsigned char *nh = skb->head + skb->network_header;
	__u16 proto = bpf_ntohs(skb->protocol);
	unsigned char *th;
	if (proto == ETH_P_IP_) {
		struct iphdr *ip = CAST(nh, struct iphdr);
		if (ip->protocol != IPPROTO_UDP_)
			return 0;
		th = nh + ip->ihl * 4;
	} else if (proto == ETH_P_IPV6_) {
		if (CAST(nh, struct ipv6hdr)->nexthdr != IPPROTO_UDP_)
			return 0;
		th = nh + sizeof(struct ipv6hdr);
	} else {
		return 0;
	}
	return bpf_ntohs(CAST(th, struct udphdr)->dest);
}

// Whether a namespace is one of the targets' (0: not known, counted). A frame dropped in another
// namespace at a port a target holds is someone else's: a bridge or a path namespace in between
// drops every frame not addressed to it as OTHERHOST (the lab's path: one per datagram).
static __always_inline int targets_netns(__u32 inum)
{
	if (!inum || !cfg.nnetns)
		return 1;
	return bpf_map_lookup_elem(&target_netns, &inum) != 0;
}

static __always_inline void drop(const struct sk_buff *skb, __u32 reason, struct sock *rx_sk)
{
	__u32 port, inum = 0;
	if (rx_sk) {
		if (rx_sk->sk_protocol != IPPROTO_UDP_)
			return;
		port = rx_sk->__sk_common.skc_num;
	} else {
		port = udp_dest_port(skb);
	}
	if (!port || !port_watched(port))
		return;
	if (rx_sk)
		inum = BPF_CORE_READ(rx_sk, __sk_common.skc_net.net, ns.inum);
	else if (skb->dev)
		inum = BPF_CORE_READ(skb, dev, nd_net.net, ns.inum);
	if (targets_netns(inum))
		count_pair(&udp_drops, reason, port);
}

// Linux 6.12+: the receiving socket is an argument (the loader loads one of the two)
SEC("tp_btf/kfree_skb")
int BPF_PROG(free_skb_sk, struct sk_buff *skb, void *location, enum skb_drop_reason reason, struct sock *rx_sk)
{
	drop(skb, reason, rx_sk);
	return 0;
}

SEC("tp_btf/kfree_skb")
int BPF_PROG(free_skb, struct sk_buff *skb, void *location, enum skb_drop_reason reason)
{
	drop(skb, reason, 0);
	return 0;
}

SEC("tp_btf/udp_fail_queue_rcv_skb")
int BPF_PROG(fail_queue, int rc, struct sock *sk)
{
	__u32 port = sk->__sk_common.skc_num;
	if (port_watched(port))
		count_pair(&udp_queue_fail, rc, port);
	return 0;
}

// ---- following (cfg.follow): a target's new process is a target from its birth, so its first
// datagrams count; the loader adds pids it is given through add_target. Not loaded without follow.

// tgid becomes a target: its index (an existing one if it is one already), or -1 (the table is full)
static __always_inline int add(__u32 tgid, __u32 parent)
{
	__u32 *have = bpf_map_lookup_elem(&target_slot, &tgid);
	if (have)
		return *have;
	__u32 i;
	if (bpf_map_pop_elem(&free_slots, &i) || i >= MAX_TARGETS) {
		__sync_fetch_and_add(&follow.refused, 1);
		return -1;
	}
	follow.parent[i] = parent;
	if (bpf_map_update_elem(&target_slot, &tgid, &i, BPF_NOEXIST))
		return -1;   // added meanwhile by the other path: its index stands, this one is not used
	// the bit last: a set bit always finds its index
	__sync_fetch_and_or(&watch.tgids[(tgid >> 6) & (TGID_WORDS - 1)], 1ULL << (tgid & 63));
	return i;
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(on_fork, struct task_struct *parent, struct task_struct *child)
{
	__u32 ptgid = parent->tgid, tgid = child->tgid;
	if (tgid == ptgid)
		return 0;   // a thread: counted under its process already
	if (!((watch.tgids[(ptgid >> 6) & (TGID_WORDS - 1)] >> (ptgid & 63)) & 1))
		return 0;
	add(tgid, ptgid);
	return 0;
}

// Run by the loader (BPF_PROG_RUN) for a pid it is given: the same allocation as a fork's.
struct add_args { __u32 tgid; __s32 index; };

SEC("syscall")
int add_target(struct add_args *a)
{
	a->index = add(a->tgid, 0);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
