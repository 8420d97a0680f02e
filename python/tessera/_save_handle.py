"""SaveHandle: a save started by CheckpointManager.save(), followed through the worker;
PendingSave: one whose snapshot is taken on a thread while the trainer goes on."""

import threading
import time

from .errors import TesseraError

# GET /v1/saves/{step} holds a wait at most this long (the worker caps timeout_ms).
SAVE_POLL_MS = 60000


class SaveHandle:
    """A save started by CheckpointManager.save(); the trainer holds it while the
    worker writes in the background.

    step:           the checkpoint's step.
    snapshot_ms:    how long the worker took to snapshot this worker's tensors.
    snapshot_bytes: how many bytes it copied (or borrowed).
    borrowing:      the worker still reads the trainer's memory (tessera.jax):
                    it must stay as it is until the save ends.
    job:            the save job's id (asks the worker, waiting until the job
                    exists, the first time it is read).
    """

    def __init__(self, manager, step, answer):
        self._manager = manager
        self.step = step
        self.checkpoint = answer.get("checkpoint") or {"mesh": manager.mesh, "step": step}
        self.snapshot_ms = answer.get("snapshot_ms")
        self.snapshot_bytes = answer.get("snapshot_bytes")
        self.borrowing = bool(answer.get("borrowing", False))
        self._job = answer.get("job")
        self._state = answer.get("state", "snapshotted")
        self._error = None

    @property
    def job(self):
        if self._job is None:
            self._update(self._manager._save_status(self.step, "started",
                                                    self._manager.timeout))
        return self._job

    @property
    def state(self):
        """What the worker last said: snapshotted, running or committed."""
        return self._state

    def _update(self, answer):
        self._job = answer.get("job") or self._job
        self._state = answer.get("state") or self._state
        return answer

    def _check(self, fn):
        if self._error is not None:
            raise self._error
        try:
            return fn()
        except TesseraError as e:
            if e.code not in ("unavailable",) and e.status != 0:
                self._error = e  # the save failed: it stays failed
            raise

    def done(self):
        """True once the checkpoint is committed, False while it is being
        written; raises TesseraError if the save failed."""
        if self._state == "committed":
            return True
        answer = self._check(lambda: self._manager._save_status(self.step, None, None))
        return self._update(answer).get("state") == "committed"

    def wait(self, timeout=None):
        """Blocks until the checkpoint is committed, returning the worker's answer
        {"checkpoint", "job", "state": "committed"}. Raises TesseraError with the
        save's error if it failed (its code, and details naming the culprit), or
        deadline_exceeded (status 0) after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._state == "committed":
                return {"checkpoint": self.checkpoint, "job": self._job, "state": "committed"}
            wait_ms = SAVE_POLL_MS
            if deadline is not None:
                left_ms = int((deadline - time.monotonic()) * 1000)
                if left_ms <= 0:
                    raise TesseraError(
                        "deadline_exceeded", "the save of step %d of mesh %s is still %s after "
                        "%g s" % (self.step, self._manager.mesh, self._state, timeout), 0,
                        {"mesh": self._manager.mesh, "step": self.step, "job": self._job})
                wait_ms = max(1, min(wait_ms, left_ms))
            try:
                answer = self._check(lambda: self._manager._save_status(
                    self.step, "committed", wait_ms / 1000.0))
            except TesseraError as e:
                if e.code != "deadline_exceeded" or e.status != 504:
                    raise
                # The wait timed out, or the save failed with a timeout: ask without waiting.
                self._error = None
                self.done()
                continue
            self._update(answer)

    def __repr__(self):
        return "SaveHandle(step=%r, job=%r, state=%r)" % (self.step, self._job, self._state)


class PendingSave:
    """A save handed to a thread: save(background=True), and tessera.jax's saves. The
    thread asks the worker to take it (`start()` returns the SaveHandle and whether
    the worker reads the trainer's memory until the save ends), then, when it does,
    holds `pins` until the save ends. snapshotted() waits for the snapshot; wait()
    for the commit, raising the save's error."""

    def __init__(self, start, step, pins=()):
        self.step = step
        self._handle, self._error = None, None
        self._pins = list(pins)
        self._started = threading.Event()
        self._released = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(start,), daemon=True,
                                        name="tessera-save-%d" % step)
        self._thread.start()

    def _run(self, start):
        borrowing = False
        try:
            self._handle, borrowing = start()
        except BaseException as e:  # noqa: BLE001 - raised again by wait()
            self._error = e
        finally:
            self._started.set()
        try:
            if borrowing:
                self._hold()
        finally:
            self._pins = []
            self._released.set()

    def _hold(self):
        """Until the save ends: committed, failed, or its worker gone."""
        while True:
            try:
                self._handle.wait(None)
                return
            except TesseraError as e:
                if e.code != "unavailable" or e.status == 0:
                    return  # failed for good, or the worker is unreachable: it reads no more
                self._released.wait(0.2)  # the worker is stopping; it may still write

    def snapshot_done(self):
        """Waits until the worker has taken (or refused) this save."""
        self._started.wait()

    def snapshotted(self):
        """Waits until the worker has taken this save's snapshot, so that the tensors
        may change; returns its SaveHandle, or raises the save's error."""
        return self.handle()

    def released(self, timeout=None):
        """Waits until the worker reads nothing more of this save's arrays; True if so."""
        return self._released.wait(timeout)

    def handle(self):
        """The SaveHandle once the worker took the save; raises the save's error."""
        self._started.wait()
        if self._error is not None:
            raise self._error
        return self._handle

    @property
    def snapshot_ms(self):
        return self.handle().snapshot_ms

    @property
    def state(self):
        """"snapshotting" until the worker took the save, then the SaveHandle's state."""
        if not self._started.is_set():
            return "snapshotting"
        return "failed" if self._error is not None else self._handle.state

    def done(self):
        return self.handle().done()

    def wait(self, timeout=None):
        """Blocks until the checkpoint is committed; raises TesseraError if it failed."""
        return self.handle().wait(timeout)

    def __repr__(self):
        return "PendingSave(step=%r, %s)" % (self.step, self._handle or "starting")
