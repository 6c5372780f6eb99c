"""A plain UDP sender and a paused receiver with a tiny buffer: exact packet I/O ground truth.

  python udp_pair.py sink RCVBUF      bind 127.0.0.1:0 with SO_RCVBUF, print the port, wait
                                      for a line on stdin, then drain and print how many arrived,
                                      and keep the socket open until stdin closes
  python udp_pair.py send PORT N SIZE one sendto() per datagram, no GSO, N datagrams
"""

import socket
import sys


def sink(rcvbuf: int) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.bind(("127.0.0.1", 0))
    print(s.getsockname()[1], flush=True)
    sys.stdin.readline()  # paused: nothing is read until told
    s.setblocking(False)
    n = 0
    while True:
        try:
            s.recv(65536)
        except BlockingIOError:
            break
        n += 1
    print(n, flush=True)
    sys.stdin.read()  # keep the socket (and its counters) alive until the test is done


def send(port: int, count: int, size: int) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    payload = b"q" * size
    for _ in range(count):
        s.sendto(payload, ("127.0.0.1", port))


if __name__ == "__main__":
    if sys.argv[1] == "sink":
        sink(int(sys.argv[2]))
    else:
        send(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
