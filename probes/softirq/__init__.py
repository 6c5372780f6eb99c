"""Opt-in: network softirq time per CPU, split by whether a target's thread was interrupted.

Two events and two clock reads per softirq run: on a VM the clock read alone
was ~5% of a busy client's CPU, so this is opt-in; by default softirq time
comes from /proc/stat and the samples' softirq share.
"""

from qprof.probes.group import BpftraceGroup

GROUP = BpftraceGroup("softirq", __name__, "network softirq time per CPU, split by whether a target was "
                      "interrupted (two events and clock reads per softirq run)",
                      ("softirq_entry", "softirq_exit"))
