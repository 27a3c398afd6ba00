"""Slow and idle clients on both of the scheduler's ports, with mTLS.

Anyone who can reach a port can open connections without a certificate or
a token, and then send nothing, or trickle a TLS ClientHello a byte at a
time. The real scheduler (mTLS on the gRPC port and on --http_listen) gets,
on each port, 100 connections trickling a handshake and 200 that send
nothing, from many loopback addresses (every 127.0.0.x is this machine),
kept up for the whole test: a connection the server ends is opened again.
Meanwhile a health check on the gRPC port, `taskgridctl stats` and a
dashboard API request, each with the client certificate, are all answered,
round after round.

Needs openssl and /usr/bin/python3 with python3-grpcio (for the health
call). Run through ctest (system.slow_clients), or by hand with
TASKGRID_SCHEDULER, TASKGRID_AGENT and TASKGRID_CTL set.
"""
import os
import socket
import ssl
import sys
import threading
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from tls_test import make_certs, server_tls  # noqa: E402

WAIT = 30.0
TRICKLERS = 100
IDLE = 200
# A TLS handshake record announcing 512 bytes, then the bytes.
HELLO = b"\x16\x03\x01\x02\x00" + b"\x01" * 512


class Pressure:
    """Keeps `TRICKLERS` trickling and `IDLE` idle connections open to a
    port, each from one of 100 loopback addresses, on a thread of its
    own, until stop()."""

    def __init__(self, port):
        self.port = port
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self.open = 0  # connections open now
        self.opened = 0  # connections opened in all
        self.socks = [None] * (TRICKLERS + IDLE)
        self.sent = [0] * TRICKLERS
        self.thread = threading.Thread(target=self.run, daemon=True)

    def connect(self, i):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(True)
        s.settimeout(5)
        try:
            s.bind((f"127.0.0.{2 + i % 100}", 0))
            s.connect(("127.0.0.1", self.port))
        except OSError:
            s.close()
            return None
        s.setblocking(False)
        return s

    def run(self):
        while not self.stopped.is_set():
            for i in range(len(self.socks)):
                s = self.socks[i]
                if s is not None:
                    try:  # the server ended it: EOF or a reset
                        if s.recv(1024) == b"":
                            raise ConnectionResetError()
                    except BlockingIOError:
                        pass
                    except OSError:
                        s.close()
                        s = self.socks[i] = None
                if s is None:
                    s = self.socks[i] = self.connect(i)
                    if s is None:
                        continue
                    with self.lock:
                        self.opened += 1
                    if i < TRICKLERS:
                        self.sent[i] = 0
                if i < TRICKLERS and self.sent[i] < len(HELLO):
                    try:
                        s.send(HELLO[self.sent[i]:self.sent[i] + 1])
                        self.sent[i] += 1
                    except OSError:
                        pass
            with self.lock:
                self.open = sum(1 for s in self.socks if s is not None)
            self.stopped.wait(0.2)
        for s in self.socks:
            if s is not None:
                s.close()

    def start(self):
        self.thread.start()
        harness.wait_until(lambda: self.open_now() == len(self.socks), timeout=WAIT,
                           what=f"{len(self.socks)} connections to port {self.port}")
        return self

    def open_now(self):
        with self.lock:
            return self.open

    def stop(self):
        self.stopped.set()
        self.thread.join(timeout=WAIT)


class SlowClientsTest(unittest.TestCase):
    def test_both_ports_answer_with_hundreds_of_slow_and_idle_connections_open(self):
        try:
            import grpc
        except ImportError:
            self.skipTest("no python3-grpcio")
        d = make_certs(self)
        client = [f"--tls_ca={d}/ca.pem", f"--tls_cert={d}/client.pem",
                  f"--tls_key={d}/client.key"]
        cluster = harness.Cluster(scheduler_flags=server_tls(d), ctl_flags=client)
        self.addCleanup(cluster.close)
        port_file = os.path.join(cluster.dir, "http-port")
        cluster.scheduler_flags += ["--http_listen=127.0.0.1:0", f"--http_port_file={port_file}"]
        cluster.start_scheduler()
        harness.wait_until(lambda: os.path.exists(port_file), what="the HTTP port file")
        http_port = int(harness.read_text(port_file).strip())
        grpc_port = int(cluster.addr.rsplit(":", 1)[1])

        pressures = [Pressure(grpc_port).start(), Pressure(http_port).start()]
        for p in pressures:
            self.addCleanup(p.stop)

        with open(f"{d}/ca.pem", "rb") as ca, open(f"{d}/client.pem", "rb") as cert, \
                open(f"{d}/client.key", "rb") as key:
            creds = grpc.ssl_channel_credentials(root_certificates=ca.read(),
                                                 private_key=key.read(),
                                                 certificate_chain=cert.read())
        context = ssl.create_default_context(cafile=f"{d}/ca.pem")
        context.load_cert_chain(f"{d}/client.pem", f"{d}/client.key")
        url = f"https://127.0.0.1:{http_port}/api/v1/cluster"
        for round_ in range(5):
            with grpc.secure_channel(cluster.addr, creds) as ch:  # a new connection each round
                check = ch.unary_unary("/grpc.health.v1.Health/Check")
                self.assertEqual(check(b"", timeout=WAIT), b"\x08\x01", round_)  # SERVING
            res = cluster.ctl("stats", check=True)
            self.assertEqual(res.returncode, 0, res.stderr)
            with urllib.request.urlopen(url, timeout=WAIT, context=context) as page:
                self.assertIn('"agents_active"', page.read().decode())
            for p in pressures:  # the pressure was on while the calls were answered
                self.assertGreaterEqual(p.open_now(), (TRICKLERS + IDLE) * 9 // 10,
                                        f"port {p.port}")
        # The HTTP port cut the tricklers off at its request deadline and
        # they came back: it held against the same pressure throughout.
        self.assertTrue(all(p.thread.is_alive() for p in pressures))


if __name__ == "__main__":
    unittest.main()
