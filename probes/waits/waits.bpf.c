// SPDX-License-Identifier: GPL-2.0
// qprof waits probes: every target thread's wall-clock time, exact, split into on a CPU,
// runnable (waiting for a CPU) and blocked by what it waited for; sampled stacks of the waits.
// (libbpf, CO-RE, BTF tracepoints.)
//
// Each target thread is a small state machine, one entry of `threads` keyed by tid:
//   switch-out (sched_switch prev): ON -> RUNNABLE (preempted) or BLOCKED (with a provisional
//       kind from the syscall it blocks in, and a sampled stack);
//   waking (sched_waking p, run in the waker's context): BLOCKED -> RUNNABLE, the kind refined
//       by who wakes it (a timer's callback: a timer; a softirq: the network; a thread of its own
//       process: a thread hand-off; blocked in io_schedule: the disk, whoever wakes it);
//   switch-in (sched_switch next): RUNNABLE -> ON.
// Each transition closes the open interval [since_ns, now) into its state's total, so a thread's
// totals plus its open interval are its whole time since the loader seeded it (UNKNOWN: no event
// yet; its first event says what it was doing since then).
//
// Cost is the design constraint: sched_switch and sched_waking fire on every context switch and
// wakeup of the host. So: a bit test per task involved (`watch`: the targets' tids), then one hash
// lookup for a target's (the idle task's tid 0 is never a target); direct BTF reads; the syscall number, the waker's interrupt state (the one
// bpf_probe_read_kernel, see preempt_count_now) and stacks are read only for target threads, stacks
// only for a sample of the blocks (~1 per stack interval per thread on average, see sample_stacks).
// Timer callbacks' bounds are hooked too (the tick and expiring timers: rare beside switches).
//
// Concurrency: a thread's events are serialised by the scheduler (its switch-out, then one
// waking under its pi_lock, then its switch-in), except that a waking on another CPU can fire
// while its switch-out has not been traced yet. Each handler therefore writes everything else
// first and publishes `phase` last (after `since_ns`); x86 keeps stores in order.

#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#define TID_WORDS 65536            // 2^22 tids as bits: PID_MAX_LIMIT on 64-bit
#define MAX_STACK_DEPTH 127        // perf_event_max_stack's default
#define STACK_ENTRIES 8192
#define EEXIST_ 17                 // bpf_get_stackid: the stack's bucket holds another stack
#define P_ONE 65536                // sampling probabilities in 1/65536
#define THREAD_SIZE_ 16384          // x86_64's kernel stack, where the task's vm area is not known
#define HARDIRQ_MASK_ 0x000f0000
#define NMI_MASK_ 0x00f00000
#define SOFTIRQ_OFFSET_ 0x00000100 // set while softirqs are served (bh disabled counts in steps of 0x200)
#define barrier() asm volatile("" ::: "memory")

// What a thread's time is spent in: the loader reads these names from this object's BTF and
// checks them against probes/waits/maps.py's STATES (WAIT_ON_CPU -> "on_cpu").
enum wait_state {
	WAIT_ON_CPU, WAIT_RUNNABLE, WAIT_NETWORK, WAIT_TIMER, WAIT_THREAD, WAIT_DISK, WAIT_OTHER,
	WAIT_NSTATES
};

// Where a thread is now.
enum thread_phase { PHASE_UNKNOWN, PHASE_ON, PHASE_RUNNABLE, PHASE_BLOCKED, PHASE_DEAD };

struct thread {
	__u64 since_ns;              // start of the open interval (bpf_ktime_get_ns: CLOCK_MONOTONIC)
	__u64 block_ns;              // start of its last block: the stack sampler's gaps
	__u64 gap_ns;                // moving average of the gaps between its blocks (0: none yet)
	__u64 ns[WAIT_NSTATES];      // closed intervals' time per state
	__u64 n[WAIT_NSTATES];       // closed intervals per state
	__s32 ustack, kstack;        // stacks of the open blocked interval (-1: none)
	__u32 p16;                   // its stacks' sampling probability (P_ONE = 1; 0: not sampled)
	__u32 tgid;
	enum thread_phase phase;
	enum wait_state kind;        // the open blocked interval's provisional kind
	__s32 syscall;               // the syscall it blocked in (-1: none)
	__u32 iowait;                // it blocked in io_schedule (task_struct.in_iowait): disk
};

struct stack_key {
	__u32 tgid;
	enum wait_state kind;        // as refined at the wait's end
	__s32 ustack, kstack;        // ids in `stacks` (-1: none)
};

struct stack_val {
	__u64 ns;                    // estimated time in this stack: each sampled wait / its probability
	__u64 raw_ns;                // the sampled waits' own time
	__u64 count;                 // sampled waits
};

// Counters of what happened beside the accounting (per CPU, summed by the loader).
struct stats {
	__u64 stacks;                // blocks whose stacks were taken
	__u64 stack_errors;          // of these, stacks the stack map refused (full, or colliding twice)
	__u64 late_wakings;          // blocked intervals closed at switch-in (the waking raced the switch-out)
	__u64 stack_keys_full;       // sampled waits lost because wait_stacks was full
	__u64 forks;                 // threads and processes of targets followed from their fork
};

// Set by the loader before load.
struct config {
	__u64 stack_interval_ns;     // mean gap between a thread's sampled stacks
	__s64 preempt_from_rq;       // __preempt_count's offset from runqueues in a CPU's per-CPU area (0: unknown)
};
const volatile struct config cfg = { .stack_interval_ns = 10000000 };

// The targets' tids as bits (.bss, set by the loader and at fork): the test every event starts
// with, two loads where a hash lookup is a helper call and a hash (the host's other tasks, nearly
// every event, stop here). A bit left by an exited thread only costs its tid's next owner a lookup.
struct watch {
	__u64 tids[TID_WORDS];
};
struct watch watch = {};

static __always_inline int watched(__u32 tid)
{
	return (watch.tids[(tid >> 6) & (TID_WORDS - 1)] >> (tid & 63)) & 1;
}

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);          // tgid
	__type(value, __u32);
} targets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 32768);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);          // tid
	__type(value, struct thread);
} threads SEC(".maps");

// A target thread's entry: the bit test first (every task of the host passes here), then the hash.
static __always_inline struct thread *target(__u32 tid)
{
	return watched(tid) ? bpf_map_lookup_elem(&threads, &tid) : NULL;
}

struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, STACK_ENTRIES);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, MAX_STACK_DEPTH * sizeof(__u64));
} stacks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct stack_key);
	__type(value, struct stack_val);
} wait_stacks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct stats);
} stats SEC(".maps");

// Per CPU: whether a timer's callback runs now (hrtimer or timer wheel, hard or soft).
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} in_timer SEC(".maps");

static __always_inline struct stats *counters(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&stats, &zero);
}

// The provisional kind of a block from the syscall it blocks in (x86_64 numbers). A read or a write
// that blocks outside io_schedule (task_struct.in_iowait, which makes any block `disk`) waits for a
// pipe, a socket, an eventfd or a terminal, not for a disk: `other` until the waker tells more.
static __always_inline __u32 syscall_kind(long nr)
{
#if defined(__TARGET_ARCH_x86)
	switch (nr) {
	case 202: case 449:                              // futex, futex_waitv
		return WAIT_THREAD;
	case 35: case 230:                               // nanosleep, clock_nanosleep
		return WAIT_TIMER;
	case 232: case 281: case 441: case 7: case 271:  // epoll_wait, epoll_pwait, epoll_pwait2, poll, ppoll
	case 23: case 270:                               // select, pselect6
	case 45: case 47: case 299:                      // recvfrom, recvmsg, recvmmsg
	case 44: case 46: case 307:                      // sendto, sendmsg, sendmmsg (a full socket buffer)
	case 43: case 288: case 42:                      // accept, accept4, connect
	case 426:                                        // io_uring_enter
		return WAIT_NETWORK;
	case 74: case 75: case 277: case 306: case 26:   // fsync, fdatasync, sync_file_range, syncfs, msync
	case 208: case 333:                              // io_getevents, io_pgetevents
		return WAIT_DISK;
	}
#endif
	return WAIT_OTHER;
}

static __always_inline void add(struct thread *t, __u32 state, __u64 d)
{
	__u64 i = state;
	asm volatile("" : "+r"(i));  // one register, bounded where it is used
	if (i >= WAIT_NSTATES)
		return;
	t->ns[i] += d;
	t->n[i] += 1;
}

// A blocked interval ends: its time to its kind, and to its stacks when they were sampled.
static __always_inline void close_blocked(struct thread *t, __u32 kind, __u64 d)
{
	add(t, kind, d);
	__u32 p16 = t->p16;
	if (!p16)
		return;
	t->p16 = 0;
	struct stack_key k = { .tgid = t->tgid, .kind = kind, .ustack = t->ustack, .kstack = t->kstack };
	__u64 est = d * P_ONE / p16;
	struct stack_val *v = bpf_map_lookup_elem(&wait_stacks, &k);
	if (!v) {
		struct stack_val init = { .ns = est, .raw_ns = d, .count = 1 };
		if (!bpf_map_update_elem(&wait_stacks, &k, &init, BPF_NOEXIST))
			return;
		v = bpf_map_lookup_elem(&wait_stacks, &k);  // another CPU made it meanwhile
		if (!v) {
			struct stats *s = counters();
			if (s)
				s->stack_keys_full++;
			return;
		}
	}
	__sync_fetch_and_add(&v->ns, est);
	__sync_fetch_and_add(&v->raw_ns, d);
	__sync_fetch_and_add(&v->count, 1);
}

// The state an open interval is closed into when the thread was last seen in `phase`.
static __always_inline void close_open(struct thread *t, __u32 phase, __u64 now, __u32 unknown_as)
{
	__u64 d = now - t->since_ns;
	if (phase == PHASE_BLOCKED)
		close_blocked(t, t->kind, d);
	else if (phase == PHASE_RUNNABLE)
		add(t, WAIT_RUNNABLE, d);
	else if (phase == PHASE_ON)
		add(t, WAIT_ON_CPU, d);
	else
		add(t, unknown_as, d);
}

// Whether to take this block's stacks: with probability min(1, mean gap / stack interval), so a
// thread gets ~1 stack per interval on average whatever its switch rate, and each sampled wait
// counts as its duration / that probability: an unbiased estimate of the time per stack (a rule
// "the first block after each interval" would always pick the wait that follows a long one).
static __always_inline void sample_stacks(void *ctx, struct thread *t, __u64 now)
{
	__u64 interval = cfg.stack_interval_ns;
	__u64 gap = t->block_ns ? now - t->block_ns : interval;
	if (gap > 4 * interval)
		gap = 4 * interval;  // one long idle gap does not buy a burst of stacks
	__u64 avg = t->gap_ns ? t->gap_ns - (t->gap_ns >> 3) + (gap >> 3) : interval;
	t->gap_ns = avg;
	t->block_ns = now;
	__u32 p16 = avg >= interval ? P_ONE : (__u32)((avg << 16) / interval);
	if (!p16)
		p16 = 1;
	t->ustack = t->kstack = -1;
	t->p16 = 0;
	if ((bpf_get_prandom_u32() & (P_ONE - 1)) >= p16)
		return;
	t->ustack = bpf_get_stackid(ctx, &stacks, BPF_F_USER_STACK);
	t->kstack = bpf_get_stackid(ctx, &stacks, 0);
	// A bucket keeps the first stack that hashed to it and refuses the others for the whole run: the
	// waits workload's ~24 distinct stacks in 8192 buckets collide in ~3% of runs (birthday odds; 1 of
	// ~85 runs here, and once in CI), and a frequent wait then lost its kernel frames every time (CI,
	// 2026-11-28: a futex wait, 183 of 1241 stacks).
	// The same stack less its innermost frame (the scheduler's own, which a wait's place never is)
	// hashes elsewhere. A user stack is not cut: its innermost frame is the call's wrapper.
	if (t->kstack == -EEXIST_)
		t->kstack = bpf_get_stackid(ctx, &stacks, 1);
	t->p16 = p16;
	struct stats *s = counters();
	if (s) {
		s->stacks++;
		if (t->ustack < 0 || t->kstack < 0)
			s->stack_errors++;
	}
}

static __always_inline void switch_out(void *ctx, struct thread *t, struct task_struct *prev, __u64 now,
				       int runnable)
{
	__u32 phase = t->phase;
	if (phase == PHASE_DEAD)
		return;
	close_open(t, phase, now, WAIT_ON_CPU);  // UNKNOWN: on a CPU since the start, or it would have switched in
	if (runnable) {
		t->since_ns = now;
		barrier();
		t->phase = PHASE_RUNNABLE;
		return;
	}
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(prev);
	long nr = regs ? (long)regs->orig_ax : -1;
	__u32 iowait = BPF_CORE_READ_BITFIELD(prev, in_iowait);
	t->syscall = nr;
	t->iowait = iowait;
	t->kind = iowait ? WAIT_DISK : syscall_kind(nr);
	sample_stacks(ctx, t, now);
	t->since_ns = now;
	barrier();
	t->phase = PHASE_BLOCKED;
}

static __always_inline void switch_in(struct thread *t, __u64 now)
{
	__u32 phase = t->phase;
	if (phase == PHASE_DEAD)
		return;
	if (phase == PHASE_BLOCKED) {
		struct stats *s = counters();
		if (s)
			s->late_wakings++;
	}
	close_open(t, phase, now, WAIT_RUNNABLE);  // UNKNOWN: runnable since the start
	t->since_ns = now;
	barrier();
	t->phase = PHASE_ON;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch, bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	__u64 now = 0;
	struct thread *t = target(prev->pid);
	if (t) {
		now = bpf_ktime_get_ns();
		// preempted (or its block undone by a pending signal): still runnable
		switch_out(ctx, t, prev, now, preempt || prev_state == 0);
	}
	t = target(next->pid);
	if (t)
		switch_in(t, now ? now : bpf_ktime_get_ns());
	return 0;
}

// The CPU's preempt count, which says whether a hard interrupt or a softirq runs now. x86_64 keeps
// it in a per-CPU variable (__preempt_count), which a program can name (__ksym) only where kallsyms
// lists data symbols (CONFIG_KALLSYMS_ALL), as qprof's kernels do not. So it is read beside this
// CPU's runqueue (the current task's cfs_rq->rq, itself a per-CPU variable): the loader takes the
// distance between the two from the kernel's BTF (its .data..percpu section). 0: not read.
static __always_inline int preempt_count_now(int *pc)
{
	if (!cfg.preempt_from_rq)
		return 0;
	struct task_struct *cur = bpf_get_current_task_btf();
	struct cfs_rq *cfs = cur->se.cfs_rq;
	if (!cfs || !bpf_core_field_exists(cfs->rq))
		return 0;
	struct rq *rq = cfs->rq;
	if (!rq)
		return 0;
	return !bpf_probe_read_kernel(pc, sizeof(*pc), (void *)((unsigned long)rq + cfg.preempt_from_rq));
}

// Without the preempt count: whether the current context runs on an interrupt stack rather than on
// the current task's own (x86_64 runs hard interrupts and the softirqs served at their exit or at
// local_bh_enable on the CPU's irq stack, but an interrupt of user mode on the task's stack: those
// read as process context). The tracepoint's argument array (`ctx`) is a local of the kernel's
// bpf_trace_run*, on the stack in use (the program's own frame may be a private per-CPU stack since
// Linux 6.13); its address's low 32 bits are compared with the task's stack.
static __always_inline int on_interrupt_stack(void *ctx)
{
	struct task_struct *cur = bpf_get_current_task_btf();
	__u32 base = (__u32)(unsigned long)cur->stack;
	__u32 size = THREAD_SIZE_;
	struct vm_struct *vm = cur->stack_vm_area;
	if (vm)
		size = vm->size;  // the stack and its guard page
	__u32 sp;
	asm volatile("r0 = %1\n\tw0 = w0\n\t%0 = r0" : "=r"(sp) : "r"(ctx) : "r0");
	return sp - base >= size;
}

static __always_inline int in_timer_callback(void)
{
	__u32 zero = 0, *flag = bpf_map_lookup_elem(&in_timer, &zero);
	return flag && *flag;
}

// Runs in the waker's context (sched_wakeup may run later, in the woken CPU's IPI).
SEC("tp_btf/sched_waking")
int BPF_PROG(on_waking, struct task_struct *p)
{
	__u32 tid = p->pid;
	struct thread *t = target(tid);
	if (!t)
		return 0;
	__u32 phase = t->phase;
	barrier();
	if (phase != PHASE_BLOCKED && phase != PHASE_UNKNOWN)
		return 0;  // a wake of a thread that was not blocked (it had not gone to sleep yet)
	__u64 now = bpf_ktime_get_ns();
	__u32 kind = phase == PHASE_BLOCKED ? t->kind : WAIT_OTHER;
	if (!(phase == PHASE_BLOCKED && t->iowait)) {  // blocked in io_schedule: disk, whoever wakes it
		int pc = 0, hard = 0, soft = 0;
		if (preempt_count_now(&pc)) {
			hard = pc & (HARDIRQ_MASK_ | NMI_MASK_);
			soft = pc & SOFTIRQ_OFFSET_;
		} else {
			soft = on_interrupt_stack(ctx);  // hard or soft: the timers are told apart below
		}
		if (in_timer_callback()) {
			// a timer expired (hrtimer or timer wheel, hard or soft): nanosleep, epoll/futex/poll
			// timeouts, timerfd, socket timeouts
			kind = WAIT_TIMER;
		} else if (hard) {
			// another hard interrupt, a device's: the syscall's kind stays (a disk's completion
			// is told by iowait above)
		} else if (soft) {
			// a softirq: packet receive (on loopback and veth, often in the sender's context); a
			// sleep or a futex can only be ended there by a timer
			kind = (kind == WAIT_TIMER || kind == WAIT_THREAD) ? WAIT_TIMER : WAIT_NETWORK;
		} else if ((__u32)(bpf_get_current_pid_tgid() >> 32) == t->tgid) {
			kind = WAIT_THREAD;  // another thread of its own process: futex, eventfd, pipe
		}
	}
	close_blocked(t, kind, now - t->since_ns);
	t->since_ns = now;
	barrier();
	t->phase = PHASE_RUNNABLE;
	return 0;
}

// A timer callback's bounds (rare beside context switches: the tick and the timers that expire).
static __always_inline void timer_flag(__u32 on)
{
	__u32 zero = 0, *flag = bpf_map_lookup_elem(&in_timer, &zero);
	if (flag)
		*flag = on;
}

SEC("tp_btf/hrtimer_expire_entry")
int BPF_PROG(hrtimer_entry) { timer_flag(1); return 0; }

SEC("tp_btf/hrtimer_expire_exit")
int BPF_PROG(hrtimer_exit) { timer_flag(0); return 0; }

SEC("tp_btf/timer_expire_entry")
int BPF_PROG(timer_entry) { timer_flag(1); return 0; }

SEC("tp_btf/timer_expire_exit")
int BPF_PROG(timer_exit) { timer_flag(0); return 0; }

// New threads of a target, and new processes it forks (followed as targets too).
SEC("tp_btf/sched_process_fork")
int BPF_PROG(on_fork, struct task_struct *parent, struct task_struct *child)
{
	__u32 ptgid = parent->tgid;
	if (!bpf_map_lookup_elem(&targets, &ptgid))
		return 0;
	__u32 tgid = child->tgid, tid = child->pid, one = 1;
	if (tgid != ptgid)
		bpf_map_update_elem(&targets, &tgid, &one, BPF_ANY);
	struct thread t = {};
	t.since_ns = bpf_ktime_get_ns();
	t.tgid = tgid;
	t.phase = PHASE_RUNNABLE;  // runnable from its creation until it first runs
	t.kind = WAIT_OTHER;
	t.syscall = -1;
	t.ustack = t.kstack = -1;
	bpf_map_update_elem(&threads, &tid, &t, BPF_ANY);
	__sync_fetch_and_or(&watch.tids[(tid >> 6) & (TID_WORDS - 1)], 1ULL << (tid & 63));
	struct stats *s = counters();
	if (s)
		s->forks++;
	return 0;
}

// A target thread exits (in its own context, on a CPU): its time ends here.
SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_exit, struct task_struct *p)
{
	__u32 tid = p->pid;
	struct thread *t = target(tid);
	if (!t)
		return 0;
	__u32 phase = t->phase;
	if (phase == PHASE_DEAD)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	close_open(t, phase, now, WAIT_ON_CPU);
	t->since_ns = now;
	barrier();
	t->phase = PHASE_DEAD;
	return 0;
}

// Run by the loader (BPF_PROG_RUN) for each thread it seeds: the bit set with an atomic OR, as
// on_fork sets its own (a plain read-modify-write from Python could undo a fork's bit set meanwhile).
struct watch_args { __u32 tid; };

SEC("syscall")
int watch_tid(struct watch_args *a)
{
	__u32 tid = a->tid;
	__sync_fetch_and_or(&watch.tids[(tid >> 6) & (TID_WORDS - 1)], 1ULL << (tid & 63));
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
