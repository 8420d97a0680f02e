"""A Jepsen-style history: every invocation and its answer, one JSON line each, in the
order they happened. Completions name their invocation; the checker (checker.py) reads
nothing but this.

    {"index": 7, "time": 1.25, "process": "job0", "type": "invoke", "f": "save", "value": {...}}
    {"index": 9, "time": 1.31, "process": "job0", "type": "ok", "f": "save", "invoke": 7, ...}

type: invoke; ok (it happened); fail (it surely did not); info (it may or may not have:
indeterminate); hang (no answer within the operation's timeout).
"""

import concurrent.futures
import json
import threading
import time

import tessera


class Hang(Exception):
    """An operation gave no answer within its timeout."""


def error_of(e):
    """An exception as the history keeps it: its code, status, message and details."""
    if isinstance(e, tessera.TesseraError):
        return {"code": e.code, "status": e.status, "message": str(e)[:600],
                "details": json.loads(json.dumps(e.details, default=str))}
    return {"code": type(e).__name__, "status": None, "message": repr(e)[:600], "details": {}}


def definite_failure(error):
    """Whether an error says the operation surely did not happen: an answer of the server
    itself refusing it (4xx). No answer, a timeout or a 5xx leave it indeterminate."""
    status = error.get("status")
    return isinstance(status, int) and 400 <= status < 500


class History:
    def __init__(self, path):
        self.path = path
        self.events = []
        self._lock = threading.Lock()
        self._file = open(path, "w")
        self._t0 = time.monotonic()
        self._completed = 0
        self.changed = threading.Condition(self._lock)

    def _add(self, event):
        with self._lock:
            event["index"] = len(self.events)
            event["time"] = round(time.monotonic() - self._t0, 4)
            self.events.append(event)
            self._file.write(json.dumps(event, default=str) + "\n")
            self._file.flush()
            if event["type"] != "invoke":
                self._completed += 1
                self.changed.notify_all()
            return event["index"]

    def invoke(self, process, f, value=None):
        return self._add({"process": process, "type": "invoke", "f": f, "value": value})

    def complete(self, invoke, type_, value=None, error=None):
        inv = self.events[invoke]
        event = {"process": inv["process"], "type": type_, "f": inv["f"], "invoke": invoke,
                 "value": value}
        if error is not None:
            event["error"] = error
        return self._add(event)

    def note(self, process, f, value=None):
        """An event that is both its invocation and its answer (the nemesis's)."""
        i = self.invoke(process, f, value)
        return self.complete(i, "ok", value)

    def completed(self):
        with self._lock:
            return self._completed

    def wait_completed(self, count, timeout):
        """Until `count` operations have completed (or `timeout` s, a bound on a fault's
        length, not a wait for a state)."""
        with self._lock:
            return self.changed.wait_for(lambda: self._completed >= count, timeout)

    def close(self):
        with self._lock:
            self._file.close()


class Runner:
    """Runs one operation with a timeout, recording it. fn() returns (type, value);
    an exception is recorded as indeterminate unless `classify` says otherwise."""

    def __init__(self, history, threads=8):
        self.history = history
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="op")

    def run(self, process, f, value, fn, timeout):
        i = self.history.invoke(process, f, value)
        future = self._pool.submit(fn)
        try:
            type_, result = future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            self.history.complete(i, "hang", {"timeout_s": timeout})
            raise Hang("%s %s %s: no answer within %g s" % (process, f, value, timeout)) from None
        except Exception as e:  # noqa: BLE001 - every failure is part of the history
            err = error_of(e)
            self.history.complete(i, "fail" if definite_failure(err) else "info", None, err)
            return None, err
        self.history.complete(i, type_, result)
        return result, None

    def close(self):
        self._pool.shutdown(wait=False, cancel_futures=True)
