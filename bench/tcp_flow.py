"""TCP flows across the WAN emulator (`forte-bench wanem`), for its validation (issue 45).

    ip netns exec wan-b python3 bench/tcp_flow.py server
    ip netns exec wan-a python3 bench/tcp_flow.py client SECONDS [cubic|bbr|reno] [RATE]

The server prints the bytes received and the goodput. The client sets its congestion control
on its own socket (this machine's default is bbr, which loss does not slow: say which), and
with RATE (bytes per second) paces it below the link's rate, so that no queue builds.

    python3 bench/tcp_flow.py sink FLOWS
    ip netns exec wan-a python3 bench/tcp_flow.py burst FLOWS BYTES [cc]

A burst: FLOWS connections opened at once, BYTES split evenly between them, what a bulk sender
with nothing else to do achieves (no TLS, no requests, no application at all). The sink prints
when the last byte arrived (wall clock, shared by the namespaces) and the burst when it began.
"""
import socket, sys, time, threading
mode, secs = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 10
if mode == "server":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("10.77.0.2", 5201)); s.listen(1)
    c, _ = s.accept(); n = 0; t0 = time.time()
    while True:
        d = c.recv(1 << 20)
        if not d: break
        n += len(d)
    dt = time.time() - t0
    print(f"received {n} bytes in {dt:.2f} s: {n/dt/1e6:.2f} MB/s", flush=True)
elif mode == "sink":
    flows = int(sys.argv[2])
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("10.77.0.2", 5201)); s.listen(flows)
    print("listening", flush=True)
    total = [0]

    def drain(c):
        while d := c.recv(1 << 20):
            total[0] += len(d)

    readers = [threading.Thread(target=drain, args=(s.accept()[0],)) for _ in range(flows)]
    [r.start() for r in readers]
    [r.join() for r in readers]
    print(f"received {total[0]} bytes, last at {time.time():.3f}", flush=True)
elif mode == "burst":
    flows, size = int(sys.argv[2]), int(sys.argv[3])
    cc = (sys.argv[4] if len(sys.argv) > 4 else "bbr").encode()
    buf = b"x" * (1 << 20)

    def send():
        c = socket.socket(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc)
        c.connect(("10.77.0.2", 5201))
        left = size // flows
        while left > 0:
            left -= c.send(buf[:min(left, len(buf))])
        c.close()

    print(f"began at {time.time():.3f}", flush=True)
    senders = [threading.Thread(target=send) for _ in range(flows)]
    [t.start() for t in senders]
    [t.join() for t in senders]
else:
    c = socket.socket(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, (sys.argv[3] if len(sys.argv) > 3 else "cubic").encode())
    if len(sys.argv) > 4: c.setsockopt(socket.SOL_SOCKET, 47, int(sys.argv[4]))  # SO_MAX_PACING_RATE
    c.connect(("10.77.0.2", 5201))
    buf = b"x" * (1 << 20); t0 = time.time()
    while time.time() - t0 < secs:
        c.sendall(buf)
    c.close()
