"""A parent that starts UDP senders as its own child processes while it is watched.

    udp_forks.py EXE PORT N SECONDS RATE   on "go" from stdin, start N senders (`EXE send PORT SECONDS
                                           1200 1 RATE`, the paced udp_stream), 0.2 s apart, wait for
                                           them, print one line per child: "pid datagrams bytes calls"

The children are fork+exec'd by this process (its own pids), so a followed run must take them up
from their fork; each child counts what it sent itself.
"""

import subprocess
import sys
import time

exe, port, n, seconds, rate = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
sys.stdin.readline()
children = []
for _ in range(n):
    children.append(subprocess.Popen([exe, "send", port, seconds, "1200", "1", rate], stdout=subprocess.PIPE, text=True))
    time.sleep(0.2)
for c in children:
    out = c.communicate()[0].split()
    print(c.pid, *out, flush=True)
