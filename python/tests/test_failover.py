"""A Client given several tesserads follows the leader: a standby's 503 not_leader
redirects it, a server that does not answer sends it to the next one (a POST only
if it never reached that server), and with one server nothing changes. Fake
servers on 127.0.0.1 play the leader, the standbys and the dead."""

import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import threading

import pytest

import tessera
from tessera._http import Endpoint

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "etcd"))
from etcd import Etcd  # noqa: E402 - tools/etcd/etcd.py


class Fake:
    """A fake tesserad. As "leader" it answers GET /api/v1/meshes with no meshes and
    POST /api/v1/gc with nothing removed; as "standby" it answers every /api/v1 call
    503 not_leader, naming `leader` (a URL or None) once it has answered `silent_for`
    calls; as "resetter" it reads each request and closes the connection unanswered.
    `header`: whether a standby names the leader in X-Tessera-Leader too. `dies_on`:
    a (method, path) whose request kills it, unanswered, as kill() does."""

    def __init__(self, role="leader", leader=None, silent_for=0, header=True, dies_on=None):
        self.role, self.leader, self.silent_for, self.header = role, leader, silent_for, header
        self.dies_on = dies_on
        self.requests = []  # (method, path) of each request read
        self.dead = False
        self._connections = []
        self._lock = threading.Lock()
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as tesserad
            disable_nagle_algorithm = True  # headers and body go out in two writes

            def log_message(self, *args):
                pass

            def setup(self):
                super().setup()
                with fake._lock:
                    fake._connections.append(self.connection)

            def _serve(self):
                n = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(n)
                with fake._lock:
                    fake.requests.append((self.command, self.path))
                    count = len(fake.requests)
                if (self.command, self.path) == fake.dies_on:
                    fake.kill()
                if fake.dead or fake.role == "resetter":
                    self.close_connection = True
                    return
                status, body, headers = fake.answer(self.command, self.path, count)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _serve

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def answer(self, method, path, count):
        if self.role == "standby":
            leader = self.leader if count > self.silent_for else None
            body = {"error": {"code": "unavailable",
                              "message": "this tesserad (%s) is a standby" % self.url,
                              "details": {"reason": "not_leader", "leader": leader,
                                          "standby": self.url}}}
            return 503, body, ({"X-Tessera-Leader": leader} if leader and self.header else {})
        if (method, path) == ("GET", "/api/v1/meshes"):
            return 200, {"meshes": []}, {}
        if (method, path) == ("POST", "/api/v1/gc"):
            return 200, {"removed": []}, {}
        return 404, {"error": {"code": "not_found", "message": "no route %s %s" % (method, path),
                               "details": {"path": path}}}, {}

    def calls(self):
        with self._lock:
            return len(self.requests)

    def kill(self):
        """As a killed process: new connections are refused, open ones closed."""
        with self._lock:
            if self.dead:
                return
            self.dead = True
            connections = list(self._connections)
        self.httpd.shutdown()
        self.httpd.server_close()
        for c in connections:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # closed already


@pytest.fixture
def fakes():
    made = []

    def make(*args, **kwargs):
        made.append(Fake(*args, **kwargs))
        return made[-1]

    yield make
    for f in made:
        f.kill()


@pytest.fixture
def dead():
    """URLs nothing listens on: bound, never listening, so connecting is refused."""
    socks = []

    def make():
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        return "http://127.0.0.1:%d" % s.getsockname()[1]

    yield make
    for s in socks:
        s.close()


def test_servers_from_a_list_a_comma_list_and_tessera_server(fakes, dead, monkeypatch):
    leader, gone = fakes(), dead()
    assert tessera.Client([gone, leader.url], token="t").servers == [gone, leader.url]
    c = tessera.Client(" %s , %s " % (gone, leader.url), token="t")
    assert c.servers == [gone, leader.url] and c.server == gone
    monkeypatch.setenv("TESSERA_SERVER", "%s,%s" % (gone, leader.url))
    c = tessera.Client(token="t")
    assert c.servers == [gone, leader.url]
    assert c.meshes() == {"meshes": []}
    assert c.server == leader.url
    with pytest.raises(tessera.TesseraError) as e:
        tessera.Client(" , ", token="t")
    assert e.value.code == "invalid_argument" and e.value.details["field"] == "server"
    with pytest.raises(tessera.TesseraError) as e:
        tessera.Client(leader.url, token="t", failover_timeout=-1)
    assert e.value.details["field"] == "failover_timeout"


def test_a_dead_first_server_sends_calls_to_the_next(fakes, dead):
    leader = fakes()
    c = tessera.Client([dead(), leader.url], token="t", failover_timeout=5)
    assert c.meshes() == {"meshes": []}
    assert c.server == leader.url
    # It stays with the leader: the dead one is not tried again.
    assert c.meshes() == {"meshes": []} and leader.calls() == 2


@pytest.mark.parametrize("header", [True, False], ids=["header", "details-only"])
def test_a_standby_redirects_to_the_leader_it_names_even_outside_the_list(fakes, header):
    leader = fakes()
    standby = fakes("standby", leader=leader.url, header=header)
    c = tessera.Client(standby.url, token="t", failover_timeout=5)
    assert c.meshes() == {"meshes": []}
    assert c.server == leader.url and c.servers == [standby.url]
    assert c.meshes() == {"meshes": []}
    assert (standby.calls(), leader.calls()) == (1, 2)


def test_standbys_without_a_leader_are_retried_until_one_is_named(fakes):
    leader = fakes()
    # Neither names a leader at first; the first does from its 4th answer on.
    first = fakes("standby", leader=leader.url, silent_for=3)
    second = fakes("standby", leader=None)
    c = tessera.Client([first.url, second.url], token="t", failover_timeout=30)
    assert c.meshes() == {"meshes": []}
    assert c.server == leader.url
    assert first.calls() == 4 and second.calls() >= 3 and leader.calls() == 1


def test_a_post_that_reached_a_server_is_not_sent_again(fakes):
    resetter, leader = fakes("resetter"), fakes()
    c = tessera.Client([resetter.url, leader.url], token="t", failover_timeout=5)
    with pytest.raises(tessera.TesseraError) as e:
        c.collect_garbage()
    assert (e.value.code, e.value.status) == ("unavailable", 0)
    assert e.value.details == {"endpoint": resetter.url}
    assert "closed" in str(e.value) and resetter.url in str(e.value)
    assert resetter.requests == [("POST", "/api/v1/gc")] and leader.calls() == 0
    # A GET may be sent again: it goes on to the leader.
    assert c.meshes() == {"meshes": []} and leader.calls() == 1


def test_a_post_to_a_leader_that_dies_on_it_is_not_sent_again(fakes):
    """On a keep-alive connection, then refused on a new one: it may have been done."""
    leader = fakes(dies_on=("POST", "/api/v1/gc"))
    standby = fakes("standby", leader=leader.url)
    c = tessera.Client([leader.url, standby.url], token="t", failover_timeout=5)
    assert c.meshes() == {"meshes": []}
    with pytest.raises(tessera.TesseraError) as e:
        c.collect_garbage()
    assert (e.value.code, e.value.status) == ("unavailable", 0)
    assert e.value.details == {"endpoint": leader.url}
    assert leader.requests[-1] == ("POST", "/api/v1/gc") and standby.calls() == 0


def test_a_refused_post_goes_to_the_next_server(fakes, dead):
    leader = fakes()
    c = tessera.Client([dead(), leader.url], token="t", failover_timeout=5)
    assert c.collect_garbage() == []
    assert leader.requests == [("POST", "/api/v1/gc")]


def test_a_leader_that_goes_away_is_replaced_even_for_a_post(fakes):
    old = fakes()
    new = fakes("standby", leader=old.url)
    c = tessera.Client([old.url, new.url], token="t", failover_timeout=5)
    assert c.meshes() == {"meshes": []} and c.server == old.url
    # The old leader's connections are closed and new ones refused: the POST
    # reaches no server, so it goes on to the new leader.
    old.kill()
    new.role = "leader"
    assert c.collect_garbage() == []
    assert c.server == new.url and new.requests[-1] == ("POST", "/api/v1/gc")


def test_no_leader_within_failover_timeout_names_every_server(fakes, dead):
    urls = [dead(), dead()]
    c = tessera.Client(urls, token="t", failover_timeout=1)
    with pytest.raises(tessera.TesseraError) as e:
        c.meshes()
    assert (e.value.code, e.value.status) == ("unavailable", 0)
    assert e.value.details["servers"] == urls and e.value.details["endpoint"] in urls
    for url in urls:
        assert "tesserad at %s is unreachable: GET /api/v1/meshes: connection refused" % url \
            in str(e.value)
    assert "failover_timeout" in str(e.value)
    # Standbys only, none naming a leader: the standby's own 503.
    standby = fakes("standby")
    c = tessera.Client(standby.url, token="t", failover_timeout=0.3)
    with pytest.raises(tessera.TesseraError) as e:
        c.meshes()
    assert (e.value.code, e.value.status) == ("unavailable", 503)
    assert e.value.details["reason"] == "not_leader" and e.value.details["servers"] == [standby.url]
    assert standby.calls() >= 2 and standby.url in str(e.value)


def test_one_server_fails_as_before(fakes, dead):
    """No answer from a single server fails at once, as Endpoint does, and errors
    are Endpoint's, word for word."""
    url = dead()
    with pytest.raises(tessera.TesseraError) as e:
        tessera.Client(url, token="t", failover_timeout=30).meshes()
    with pytest.raises(tessera.TesseraError) as plain:
        Endpoint(url, "tesserad", token="t").json("GET", "/api/v1/meshes")
    assert (str(e.value), e.value.code, e.value.status, e.value.details) == \
        (str(plain.value), plain.value.code, plain.value.status, plain.value.details)
    assert e.value.details == {"endpoint": url}
    leader = fakes()
    with pytest.raises(tessera.TesseraError) as e:
        tessera.Client(leader.url, token="t").mesh("m")
    with pytest.raises(tessera.TesseraError) as plain:
        Endpoint(leader.url, "tesserad", token="t").json("GET", "/api/v1/meshes/m")
    assert (str(e.value), e.value.code, e.value.status, e.value.details) == \
        (str(plain.value), plain.value.code, plain.value.status, plain.value.details)
    assert e.value.status == 404 and leader.calls() == 2


def test_threads_share_the_leader_they_find(fakes, dead):
    leader = fakes()
    standby = fakes("standby", leader=leader.url)
    c = tessera.Client([dead(), standby.url], token="t", failover_timeout=10)
    results, errors = [], []

    def work():
        try:
            for _ in range(20):
                results.append(c.meshes())
        except tessera.TesseraError as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and results == [{"meshes": []}] * 160
    assert c.server == leader.url and leader.calls() == 160
    # Each thread went to the standby at most once before it knew the leader.
    assert standby.calls() <= 8


def running(pid):
    """Whether the process lives (a zombie does not count)."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return bool(f.read())
    except OSError:
        return False


def test_a_throwaway_etcd():
    if not os.path.exists("/usr/bin/etcd") or not shutil.which("etcdctl"):
        pytest.skip("no /usr/bin/etcd or etcdctl (Debian's etcd-server and etcd-client; "
                    "tools/setup.sh installs them)")
    with Etcd() as a, Etcd() as b:  # two on free ports, side by side
        assert a.url != b.url and a.url.startswith("etcd://127.0.0.1:")
        assert a.endpoint == "http://" + a.url[len("etcd://"):]
        assert a.get("k") is None
        subprocess.run(["etcdctl", "--endpoints", a.endpoint, "put", "k", "v"], check=True,
                       stdout=subprocess.DEVNULL)
        assert a.get("k") == "v" and b.get("k") is None
        with open(os.path.join(a.dir, "etcd.pid")) as f:
            pid = int(f.read())
        assert running(pid)
    assert not running(pid)  # stop() waited for it to exit
