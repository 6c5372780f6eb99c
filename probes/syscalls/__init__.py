"""Opt-in: duration distribution of the UDP send/receive system calls, and mmsg batching.

Any syscall tracepoint puts every task's system calls on the slow path, and
this group adds two events and a map update per call: opt-in.
"""

from qprof.probes.group import BpftraceGroup

GROUP = BpftraceGroup("syscalls", __name__, "duration of the UDP send/receive system calls and messages per "
                      "sendmmsg/recvmmsg (two events and a map update per call)", ("sys_enter", "sys_exit"))
