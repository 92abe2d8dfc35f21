"""One TCP flow across the WAN emulator (`forte-bench wanem`), for its validation (issue 45).

    ip netns exec wan-b python3 bench/tcp_flow.py server
    ip netns exec wan-a python3 bench/tcp_flow.py client SECONDS [cubic|bbr|reno] [RATE]

The server prints the bytes received and the goodput. The client sets its congestion control
on its own socket (this machine's default is bbr, which loss does not slow: say which), and
with RATE (bytes per second) paces it below the link's rate, so that no queue builds.
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
else:
    c = socket.socket(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, (sys.argv[3] if len(sys.argv) > 3 else "cubic").encode())
    if len(sys.argv) > 4: c.setsockopt(socket.SOL_SOCKET, 47, int(sys.argv[4]))  # SO_MAX_PACING_RATE
    c.connect(("10.77.0.2", 5201))
    buf = b"x" * (1 << 20); t0 = time.time()
    while time.time() - t0 < secs:
        c.sendall(buf)
    c.close()
