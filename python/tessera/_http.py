"""HTTP to tesserad and to workers: one keep-alive connection per thread and
endpoint, a timeout on every call, and every failure as a TesseraError."""

import http.client
import json
import os
import socket
import ssl
import threading
import urllib.parse

from .errors import TesseraError, code_of_status

# Errors of a reused keep-alive connection that the server had already closed
# (it drops idle connections after a few seconds): the request never reached
# it, so it is sent again once on a fresh connection.
_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError,
          ConnectionAbortedError)


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
        for attempt in (0, 1):
            conn = self._connection()
            reused = conn.sock is not None
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            try:
                conn.request(method, path, body=body, headers=hdrs)
                resp = conn.getresponse()
                data = resp.read()
            except _STALE as e:
                conn.close()
                if reused and attempt == 0:
                    continue
                raise self._no_answer(method, path, "the connection was closed (%s)" %
                                      (type(e).__name__,), "unavailable") from None
            except socket.timeout:
                conn.close()
                raise self._no_answer(method, path, "no answer within %g s" % timeout,
                                      "deadline_exceeded") from None
            except ssl.SSLCertVerificationError as e:
                conn.close()
                raise self._no_answer(
                    method, path, "its certificate is not trusted (%s): pass tls_ca= or set "
                    "TESSERA_TLS_CA to the PEM file of the CA that signed it" % e.verify_message,
                    "unavailable") from None
            except ssl.SSLError as e:
                conn.close()
                raise self._no_answer(method, path, "TLS failed (%s); is it serving HTTPS?" % e,
                                      "unavailable") from None
            except ConnectionRefusedError:
                conn.close()
                raise self._no_answer(method, path, "connection refused", "unavailable") from None
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                raise self._no_answer(method, path, str(e) or type(e).__name__,
                                      "unavailable") from None
            if resp.will_close:
                conn.close()
            if 200 <= resp.status < 300:
                return resp.status, resp.headers, data
            raise self._error(method, path, resp.status, data)
        raise AssertionError("unreachable")

    def json(self, method, path, body=None, timeout=None):
        """call() and decode the answer's JSON (None for an empty body)."""
        _, _, data = self.call(method, path, body, timeout)
        if not data:
            return None
        try:
            return json.loads(data)
        except ValueError:
            raise TesseraError("internal", "%s %s%s answered something that is not JSON: %r"
                               % (method, self.url, path, data[:200]), 0,
                               {"endpoint": self.url}) from None

    def _no_answer(self, method, path, why, code):
        return TesseraError(code, "%s at %s is unreachable: %s %s: %s" % (
            self.what, self.url, method, path.split("?")[0], why), 0, {"endpoint": self.url})

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
