"""SaveHandle: a save started by CheckpointManager.save(), followed through the worker."""

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
