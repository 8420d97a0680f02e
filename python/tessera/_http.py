"""HTTP to tesserad and to workers: one keep-alive connection per thread and
endpoint, a timeout on every call, every failure as a TesseraError, and calls to
tesserad that follow its leader among several servers (Servers)."""

import http.client
import json
import os
import select
import socket
import ssl
import threading
import time
import urllib.parse

from .errors import TesseraError, code_of_status

# Errors of a reused keep-alive connection that the server closed as the request
# went out (it drops idle connections after a few seconds; one it closed before
# is not reused, see _dropped): the request is sent again once on a fresh
# connection. (Servers still counts it as sent: the server may have died on it.)
_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError,
          ConnectionAbortedError)


def _dropped(sock):
    """Whether an idle keep-alive connection has something to read: the server
    closed it (or sent what nobody asked for), so it must not carry a request."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


class _Connection(http.client.HTTPConnection):
    """HTTPConnection with Nagle off: requests are small and latency matters."""

    def connect(self):
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _TlsConnection(http.client.HTTPSConnection):
    """HTTPSConnection with Nagle off."""

    def connect(self):
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def tls_context(tls_ca=None):
    """An SSL context that verifies servers against `tls_ca` (a PEM file), else
    $TESSERA_TLS_CA, else the system's CAs."""
    cafile = tls_ca or os.environ.get("TESSERA_TLS_CA") or None
    try:
        return ssl.create_default_context(cafile=cafile)
    except (OSError, ssl.SSLError) as e:
        raise TesseraError("invalid_argument", "cannot load the TLS CA file %r: %s" % (cafile, e),
                           0, {"field": "tls_ca", "file": cafile}) from None


def quote(text):
    """Percent-encodes a path segment or query value (keeps '/', as the routes expect)."""
    return urllib.parse.quote(str(text), safe="/")


def query(params):
    """'?a=1&b=x' from a dict, leaving out None values."""
    items = [(k, v) for k, v in params.items() if v is not None]
    if not items:
        return ""
    return "?" + "&".join("%s=%s" % (k, urllib.parse.quote(str(v), safe=",/")) for k, v in items)


def local_credential_path(port):
    """Where a worker whose local API listens on `port` writes its credential by default."""
    return "/tmp/tessera-%d/local-%d.key" % (os.getuid(), port)


def local_credential(url, credential_file=None):
    """The local credential of the worker at `url`: read from `credential_file`,
    else $TESSERA_LOCAL_CREDENTIAL, else the default path of the URL's port.
    None when there is no such file (the worker then answers 401, naming it)."""
    path = credential_file or os.environ.get("TESSERA_LOCAL_CREDENTIAL")
    if not path:
        port = urllib.parse.urlsplit(url if "://" in url else "http://" + url).port
        if not port:
            return None
        path = local_credential_path(port)
    try:
        with open(path) as f:
            return f.read().strip() or None
    except FileNotFoundError:
        if credential_file:
            raise TesseraError("not_found", "no local credential file %s" % path, 0,
                               {"field": "credential_file", "file": path}) from None
        return None
    except OSError as e:
        raise TesseraError("unauthenticated", "cannot read the worker's local credential %s: %s"
                           % (path, e.strerror), 0,
                           {"field": "credential_file", "file": path}) from None


def _decode(method, url, path, data):
    """The JSON of an answer's body (None for an empty one)."""
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError:
        raise TesseraError("internal", "%s %s%s answered something that is not JSON: %r"
                           % (method, url, path, data[:200]), 0, {"endpoint": url}) from None


class Endpoint:
    """One HTTP server (tesserad or a worker's local API)."""

    def __init__(self, url, what, token=None, timeout=60.0, tls_ca=None):
        parsed = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise TesseraError("invalid_argument",
                               "%s address %r is not an http(s)://host:port URL" % (what, url),
                               0, {"field": what, "endpoint": url})
        self.url = "%s://%s" % (parsed.scheme, parsed.netloc)
        self.what = what
        self.host = parsed.hostname
        self.port = parsed.port or (443 if parsed.scheme == "https" else 80)
        self._tls = tls_context(tls_ca) if parsed.scheme == "https" else None
        self.token = token
        self.timeout = float(timeout)
        self._local = threading.local()

    def close(self):
        """Closes this thread's connection (others close when their thread ends)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def _connection(self):
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self._tls is not None:
                conn = _TlsConnection(self.host, self.port, timeout=self.timeout,
                                      context=self._tls)
            else:
                conn = _Connection(self.host, self.port, timeout=self.timeout)
            self._local.conn = conn
        return conn

    def call(self, method, path, body=None, timeout=None, headers=None):
        """Sends one request; returns (status, headers, body bytes) of a 2xx answer.

        `body`: bytes/bytearray/memoryview sent as is, anything else as JSON
        (POST without a body sends {}). `timeout`: seconds for connecting and for
        each read. Raises TesseraError for a non-2xx answer (from its JSON error),
        and for no answer at all (code unavailable or deadline_exceeded, status 0).
        """
        status, hdrs, data = self.request(method, path, body, timeout, headers)
        if 200 <= status < 300:
            return status, hdrs, data
        raise self._error(method, path, status, data)

    def request(self, method, path, body=None, timeout=None, headers=None):
        """call(), but returns any answer, 2xx or not; raises only for no answer."""
        timeout = self.timeout if timeout is None else float(timeout)
        hdrs = {"Connection": "keep-alive"}
        if self.token:
            hdrs["Authorization"] = "Bearer " + self.token
        if body is None and method in ("POST", "PUT"):
            body = {}
        if body is not None and not isinstance(body, (bytes, bytearray, memoryview)):
            body = json.dumps(body).encode()
            hdrs["Content-Type"] = "application/json"
        elif body is not None:
            hdrs["Content-Type"] = "application/octet-stream"
        if headers:
            hdrs.update(headers)
        sent = False  # whether the request may have reached the server, on any attempt
        for attempt in (0, 1):
            conn = self._connection()
            if conn.sock is not None and _dropped(conn.sock):
                conn.close()  # closed by the server while idle: open a new one
            reused = conn.sock is not None
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            try:
                if not reused:
                    conn.connect()
                sent = True
                conn.request(method, path, body=body, headers=hdrs)
                resp = conn.getresponse()
                data = resp.read()
            except _STALE as e:
                conn.close()
                if reused and attempt == 0:
                    continue
                raise self._no_answer(method, path, "the connection was closed (%s)" %
                                      (type(e).__name__,), "unavailable", sent) from None
            except socket.timeout:
                conn.close()
                raise self._no_answer(method, path, "no answer within %g s" % timeout,
                                      "deadline_exceeded", sent, retry=not sent) from None
            except ssl.SSLCertVerificationError as e:
                conn.close()
                raise self._no_answer(
                    method, path, "its certificate is not trusted (%s): pass tls_ca= or set "
                    "TESSERA_TLS_CA to the PEM file of the CA that signed it" % e.verify_message,
                    "unavailable", sent, retry=False) from None
            except ssl.SSLError as e:
                conn.close()
                raise self._no_answer(method, path, "TLS failed (%s); is it serving HTTPS?" % e,
                                      "unavailable", sent) from None
            except ConnectionRefusedError:
                conn.close()
                raise self._no_answer(method, path, "connection refused", "unavailable",
                                      sent) from None
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                raise self._no_answer(method, path, str(e) or type(e).__name__,
                                      "unavailable", sent) from None
            if resp.will_close:
                conn.close()
            return resp.status, resp.headers, data
        raise AssertionError("unreachable")

    def json(self, method, path, body=None, timeout=None):
        """call() and decode the answer's JSON (None for an empty body)."""
        _, _, data = self.call(method, path, body, timeout)
        return _decode(method, self.url, path, data)

    def _no_answer(self, method, path, why, code, sent=True, retry=True):
        """The error of a call without an answer. For Servers: `_sent`, whether the
        request may have reached the server; `_retry`, whether another server may
        answer (not for an untrusted certificate, nor a read that timed out)."""
        err = TesseraError(code, "%s at %s is unreachable: %s %s: %s" % (
            self.what, self.url, method, path.split("?")[0], why), 0, {"endpoint": self.url})
        err._sent = sent
        err._retry = retry
        return err

    def _error(self, method, path, status, data):
        try:
            err = json.loads(data)["error"]
            code = err.get("code") or code_of_status(status)
            message = err.get("message") or ""
            details = err.get("details") or {}
            if not isinstance(details, dict):
                details = {"details": details}
        except (ValueError, KeyError, TypeError, AttributeError):
            code, details = code_of_status(status), {}
            message = data[:500].decode("utf-8", "replace").strip() or "HTTP %d" % status
        return TesseraError(code, "%s (%s %s on %s %s)" % (
            message, method, path.split("?")[0], self.what, self.url), status, details)


# Pauses between rounds of failover retries: the first, and the longest.
_BACKOFF_FIRST_S = 0.05
_BACKOFF_MAX_S = 1.0
# Methods that may be sent again after a request got no answer: a server that
# received it and died before answering did no harm that a repeat would double.
_IDEMPOTENT = frozenset(("GET", "HEAD", "PUT", "DELETE", "OPTIONS"))


def server_urls(servers):
    """The URLs of `servers`: "URL1,URL2" or a list (or tuple) of URLs."""
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    return [str(u).strip() for u in items if str(u).strip()]


class Servers:
    """Several tesserads, one of which leads while the others stand by: the same
    call/json/close/url as Endpoint, with each call going to the leader.

    A standby answers 503 with details.reason "not_leader", naming the leader in
    the X-Tessera-Leader header (and details.leader) when it knows one: the call
    goes there, even to a URL not in the list, else to the next URL of the list.
    A call without an answer (refused, reset, closed) goes to the next URL too,
    but a POST only if it never reached a server (it may have been done).
    Retries go round the list, pausing 50 ms, doubling to 1 s, after each round,
    until failover_timeout seconds after the first failure; then the last error
    is raised, naming every server tried. With a single URL and no standby
    involved, calls and errors are exactly Endpoint's: no answer fails at once.
    """

    def __init__(self, servers, what, token=None, timeout=60.0, tls_ca=None,
                 failover_timeout=30.0):
        urls = server_urls(servers)
        if not urls:
            raise TesseraError("invalid_argument", "no %s address in %r" % (what, servers), 0,
                               {"field": "server"})
        if (isinstance(failover_timeout, bool) or not isinstance(failover_timeout, (int, float))
                or not failover_timeout >= 0):
            raise TesseraError("invalid_argument", "failover_timeout must be a number of "
                               "seconds >= 0, not %r" % (failover_timeout,), 0,
                               {"field": "failover_timeout"})
        self.what = what
        self.token = token
        self.timeout = float(timeout)
        self.failover_timeout = float(failover_timeout)
        self._tls_ca = tls_ca
        self._lock = threading.Lock()
        self._by_url = {}    # url -> Endpoint, for every server known
        self._rotation = []  # the order retries go round: the list, then leaders learned
        for url in urls:
            ep = Endpoint(url, what, token=token, timeout=timeout, tls_ca=tls_ca)
            if ep.url not in self._by_url:
                self._by_url[ep.url] = ep
                self._rotation.append(ep)
        self.servers = [ep.url for ep in self._rotation]
        self._current = self._rotation[0]  # guarded by _lock

    @property
    def url(self):
        """The URL calls go to now: the leader, once found."""
        with self._lock:
            return self._current.url

    def close(self):
        """Closes this thread's connections (others close when their thread ends)."""
        with self._lock:
            endpoints = list(self._rotation)
        for ep in endpoints:
            ep.close()

    def call(self, method, path, body=None, timeout=None, headers=None):
        """Endpoint.call() on the leader."""
        _, answer = self._call(method, path, body, timeout, headers)
        return answer

    def json(self, method, path, body=None, timeout=None):
        """call() and decode the answer's JSON (None for an empty body)."""
        ep, (_, _, data) = self._call(method, path, body, timeout, None)
        return _decode(method, ep.url, path, data)

    def _call(self, method, path, body, timeout, headers):
        """(the endpoint that answered, its (status, headers, body) of a 2xx)."""
        with self._lock:
            ep = self._current
        errors = {}  # url -> its last error, in the order first tried
        deadline = None
        pause = _BACKOFF_FIRST_S
        attempts = 0  # since the last pause
        while True:
            try:
                status, hdrs, data = ep.request(method, path, body, timeout, headers)
            except TesseraError as e:
                err = e
                with self._lock:
                    alone = len(self._rotation) < 2
                if alone or not self._may_retry(err, method):
                    raise  # as Endpoint does
                nxt = self._move(ep)
            else:
                if 200 <= status < 300:
                    return ep, (status, hdrs, data)
                err = ep._error(method, path, status, data)
                if status != 503 or err.details.get("reason") != "not_leader":
                    raise err
                leader = self._leader(ep, hdrs.get("X-Tessera-Leader")
                                      or err.details.get("leader"))
                nxt = self._move(ep, leader)
            errors[ep.url] = err
            now = time.monotonic()
            if deadline is None:
                deadline = now + self.failover_timeout
            if now >= deadline:
                raise self._gave_up(method, path, errors, ep, err)
            attempts += 1
            with self._lock:
                round_done = attempts >= len(self._rotation)
            if round_done:
                time.sleep(min(pause, deadline - now))
                pause = min(2 * pause, _BACKOFF_MAX_S)
                attempts = 0
            ep = nxt

    @staticmethod
    def _may_retry(err, method):
        """Whether a call without an answer may go to another server."""
        if err.status != 0 or not getattr(err, "_retry", False):
            return False
        return method in _IDEMPOTENT or not err._sent

    def _leader(self, standby, named):
        """The Endpoint of the leader a standby named (None for none, or a name that is
        no URL), with the standby's scheme, token and CA: one made and added to the
        rotation if it is not in the list."""
        if not named or not isinstance(named, str):
            return None
        parsed = urllib.parse.urlsplit(named if "://" in named else "http://" + named)
        if not parsed.hostname:
            return None
        url = "%s://%s" % (urllib.parse.urlsplit(standby.url).scheme, parsed.netloc)
        with self._lock:
            ep = self._by_url.get(url)
        if ep is not None:
            return ep
        try:
            new = Endpoint(url, self.what, token=self.token, timeout=self.timeout,
                           tls_ca=self._tls_ca)
        except TesseraError:
            return None
        with self._lock:
            ep = self._by_url.setdefault(new.url, new)
            if ep is new:
                self._rotation.append(new)
        return ep

    def _move(self, failed, leader=None):
        """Where calls go after `failed` did not lead: `leader` if named; else the next
        of the rotation, unless another thread has moved on from `failed` already."""
        with self._lock:
            if leader is not None:
                self._current = leader
            elif self._current is failed:
                i = self._rotation.index(failed)
                self._current = self._rotation[(i + 1) % len(self._rotation)]
            return self._current

    def _gave_up(self, method, path, errors, last, err):
        """The last error, as one naming every server tried and the error from each."""
        details = dict(err.details)
        details["endpoint"] = last.url
        details["servers"] = list(errors)
        return TesseraError(err.code, "%s %s: no %s answered as the leader within %g s "
                            "(failover_timeout); tried %s: %s" % (
                                method, path.split("?")[0], self.what, self.failover_timeout,
                                ", ".join(errors), "; ".join(e.message for e in errors.values())),
                            err.status, details)
