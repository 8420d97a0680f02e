"""The HTTP layer against servers that misbehave: nothing hangs, every failure is
a TesseraError, and a keep-alive connection the server dropped is replaced."""

import socket
import threading
import time

import pytest

import tessera
from tessera._http import Endpoint


class FakeServer:
    """Accepts connections on 127.0.0.1 and runs handler(conn) for each, in a thread."""

    def __init__(self, handler):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        self.handler = handler
        self.connections = 0
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self.handler, args=(conn,), daemon=True).start()

    def close(self):
        self.sock.close()


def read_request(conn):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            n = int(line.split(b":")[1])
            while len(body) < n:
                body += conn.recv(65536)
    return head


def answer(conn, status, body, close_after=False):
    conn.sendall(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (status, len(body), body))
    if close_after:
        conn.close()  # without saying so: the client finds out on its next request


def test_a_dropped_keep_alive_connection_is_replaced():
    server = FakeServer(lambda conn: read_request(conn) and answer(conn, 200, b'{"ok": 1}', True))
    ep = Endpoint(server.url, "worker", timeout=5)
    for _ in range(3):
        assert ep.json("POST", "/v1/x", {}) == {"ok": 1}
        time.sleep(0.05)
    assert server.connections == 3
    server.close()


def test_no_answer_is_deadline_exceeded_at_the_timeout():
    server = FakeServer(lambda conn: (read_request(conn), time.sleep(10)))
    ep = Endpoint(server.url, "worker", timeout=0.3)
    with pytest.raises(tessera.TesseraError) as e:
        ep.json("GET", "/v1/tensors")
    # deadline_exceeded: the client's own timeout ended the call (the server holds it 10 s).
    assert (e.value.code, e.value.status) == ("deadline_exceeded", 0)
    assert server.url in str(e.value) and e.value.details == {"endpoint": server.url}
    server.close()


def test_an_answer_that_is_not_a_json_error():
    server = FakeServer(lambda conn: read_request(conn) and answer(conn, 503, b"overloaded"))
    with pytest.raises(tessera.TesseraError) as e:
        Endpoint(server.url, "worker", timeout=5).json("GET", "/v1/tensors")
    assert (e.value.code, e.value.status) == ("unavailable", 503)
    assert "overloaded" in str(e.value)
    server.close()


def test_a_connection_closed_mid_answer_is_unavailable():
    def half(conn):
        read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"a\"")
        conn.close()
    server = FakeServer(half)
    with pytest.raises(tessera.TesseraError) as e:
        Endpoint(server.url, "worker", timeout=5).json("GET", "/v1/tensors")
    assert (e.value.code, e.value.status) == ("unavailable", 0)
    server.close()


def test_a_worker_that_dies_is_named():
    from tessera.local import LocalCluster
    with LocalCluster(workers=1, heartbeat_ms=100, lease_ms=1000) as c:
        c.client().register_mesh("solo", {"data": 1})
        m = tessera.CheckpointManager("solo", worker=c.worker_urls[0], timeout=5)
        m.attach("w", (4,), "float32")
        c.kill_worker(0)
        with pytest.raises(tessera.TesseraError) as e:
            m.save(1)
        assert e.value.code == "unavailable" and c.worker_urls[0] in str(e.value)
