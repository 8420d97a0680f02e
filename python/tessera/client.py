"""The REST control plane (tesserad, /api/v1), for operators and launchers."""

import os
import time

from ._http import Servers, query, quote
from .errors import STATUS_OF_CODE, TesseraError, invalid_argument

DEFAULT_SERVER = "http://127.0.0.1:7070"

# One long-poll asks for at most this much (tesserad holds a thread meanwhile).
_POLL_MS = 20000


def _step_text(step):
    if step == "latest":
        return step
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise invalid_argument("step must be a non-negative int or 'latest', not %r" % (step,),
                               field="step")
    return str(step)


def job_error(job):
    """The TesseraError of a failed or cancelled job's JSON."""
    err = job.get("error") or {}
    code = err.get("code") or ("conflict" if job.get("state") == "cancelled" else "internal")
    details = dict(err.get("details") or {})
    details.setdefault("job", job.get("id"))
    if job.get("mesh") is not None:
        details.setdefault("mesh", job.get("mesh"))
    message = "%s job %s %s: %s" % (job.get("kind", ""), job.get("id"), job.get("state"),
                                    err.get("message") or "no reason given")
    return TesseraError(code, message, STATUS_OF_CODE.get(code, 500), details)


class Job:
    """A save, restore, verify or collectives job started through tesserad.

    ``str(job)`` is its id. ``wait()`` blocks until it ends and returns its final
    JSON (docs/openapi.json "Jobs"), or raises TesseraError with the job's error.
    """

    def __init__(self, client, job_id, answer=None):
        self.client = client
        self.id = job_id
        self.answer = answer or {}

    @property
    def checkpoint(self):
        """{"mesh", "step"} of a save or restore, as tesserad answered when starting it."""
        return self.answer.get("checkpoint")

    def get(self, wait_ms=None):
        """The job's JSON now (or after up to wait_ms if it is still running)."""
        return self.client.job(self.id, wait_ms=wait_ms)

    def wait(self, timeout=None):
        return self.client.wait_job(self.id, timeout=timeout)

    def cancel(self):
        return self.client.cancel_job(self.id)

    def __str__(self):
        return self.id

    def __repr__(self):
        return "Job(%r)" % self.id


def _read_token_file(path):
    """The first line of a token file (TESSERA_TOKEN_FILE)."""
    try:
        with open(path) as f:
            token = f.readline().strip()
    except OSError as e:
        raise TesseraError("not_found", "cannot read the token file %s: %s" % (path, e), 0,
                           {"field": "TESSERA_TOKEN_FILE", "file": path})
    if not token:
        raise TesseraError("invalid_argument", "the token file %s is empty" % path, 0,
                           {"field": "TESSERA_TOKEN_FILE", "file": path})
    return token


class Client:
    """tesserad's REST API.

    server: its URL, or the URLs of a leader and its standbys as a list or as
            "URL1,URL2" (default: env TESSERA_SERVER, likewise, else
            http://127.0.0.1:7070). Calls go to the leader: a standby's 503
            not_leader redirects them, and a server that does not answer sends
            them to the next one (a POST only if it never reached that server).
    token:  the bearer token (default: env TESSERA_TOKEN, else the first line of the
            file env TESSERA_TOKEN_FILE names).
    timeout: seconds for each call (long-polls add their own wait on top).
    tls_ca: for an https:// server, the PEM file of the CA that signed its
            certificate (default: env TESSERA_TLS_CA, else the system's CAs).
    failover_timeout: seconds a call keeps looking for the leader after its
            first failure, before raising the last error.
    Every method raises TesseraError on failure.

    servers: the URLs given; server: the one in use now (the leader, once found).
    """

    def __init__(self, server=None, token=None, timeout=60.0, tls_ca=None,
                 failover_timeout=30.0):
        server = server or os.environ.get("TESSERA_SERVER") or DEFAULT_SERVER
        token = token if token is not None else os.environ.get("TESSERA_TOKEN")
        if token is None and os.environ.get("TESSERA_TOKEN_FILE"):
            token = _read_token_file(os.environ["TESSERA_TOKEN_FILE"])
        self._http = Servers(server, "tesserad", token=token, timeout=timeout, tls_ca=tls_ca,
                             failover_timeout=failover_timeout)
        self.servers = list(self._http.servers)

    @property
    def server(self):
        """The URL calls go to now: the leader, once found."""
        return self._http.url

    def close(self):
        self._http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method, path, body=None, timeout=None):
        return self._http.json(method, "/api/v1" + path, body, timeout)

    # -- cluster and workers

    def health(self):
        return self._http.json("GET", "/healthz")

    def cluster(self):
        return self._call("GET", "/cluster")

    def workers(self):
        return self._call("GET", "/workers")

    def worker(self, worker_id):
        return self._call("GET", "/workers/" + quote(worker_id))

    def delete_worker(self, worker_id):
        self._call("DELETE", "/workers/" + quote(worker_id))

    # -- meshes

    def register_mesh(self, name, axes, devices_per_worker=1, workers=None, self_test=None,
                      self_test_timeout_ms=None):
        """Registers (idempotently) a mesh; returns it with its device table.

        axes: ordered {"data": 2, "model": 2} (or a list of (name, size) pairs).
        workers: worker ids by rank (default: the first alive workers).
        """
        pairs = list(axes.items()) if hasattr(axes, "items") else [tuple(a) for a in axes]
        body = {"axes": [{"name": n, "size": s} for n, s in pairs],
                "devices_per_worker": devices_per_worker}
        if workers is not None:
            body["workers"] = list(workers)
        if self_test is not None:
            body["self_test"] = bool(self_test)
        if self_test_timeout_ms is not None:
            body["self_test_timeout_ms"] = self_test_timeout_ms
        timeout = self._http.timeout + (self_test_timeout_ms or 10000) / 1000.0
        return self._call("PUT", "/meshes/" + quote(name), body, timeout=timeout)

    def mesh(self, name):
        return self._call("GET", "/meshes/" + quote(name))

    def meshes(self):
        return self._call("GET", "/meshes")

    def delete_mesh(self, name):
        self._call("DELETE", "/meshes/" + quote(name))

    # -- checkpoints

    def checkpoints(self, mesh):
        """The mesh's checkpoints, newest first: [{step, state, tensors, ...}]."""
        return self._call("GET", "/meshes/%s/checkpoints" % quote(mesh))

    def checkpoint(self, mesh, step):
        """One checkpoint (step may be "latest") with its tensors and metadata."""
        return self._call("GET", "/meshes/%s/checkpoints/%s" % (quote(mesh), _step_text(step)))

    def latest_step(self, mesh):
        """The newest committed step of the mesh, or None."""
        steps = [c["step"] for c in self.checkpoints(mesh) if c.get("state") == "committed"]
        return max(steps) if steps else None

    def save(self, mesh, step, tensors=None, metadata=None, compression=None, level=None,
             tier=None, full=None, full_every=None, **memory):
        """Starts a save of what the mesh's workers hold; returns its Job. Incremental
        unless full=True or every full_every-th save (CheckpointManager.save). tier="memory":
        a memory checkpoint (docs/memory-tier.md), with the options of
        CheckpointManager.save in `memory`."""
        body = dict(memory, step=step)
        if tier is not None:
            body["tier"] = tier
        for key, value in (("tensors", tensors), ("metadata", metadata),
                           ("compression", compression), ("level", level),
                           ("full", full), ("full_every", full_every)):
            if value is not None:
                body[key] = list(value) if key == "tensors" else value
        answer = self._call("POST", "/meshes/%s/checkpoints" % quote(mesh), body)
        return Job(self, answer["job"], answer)

    def restore(self, mesh, step="latest", target_mesh=None, tensors=None, layouts=None):
        """Starts a restore of `step` onto target_mesh (default: mesh); returns its Job.

        layouts: {tensor: [axis name or None, ...]} to reshard.
        """
        body = {}
        if target_mesh is not None:
            body["target_mesh"] = target_mesh
        if tensors is not None:
            body["tensors"] = list(tensors)
        if layouts is not None:
            body["layouts"] = {k: [a if a is not None else "unsharded" for a in v]
                               for k, v in layouts.items()}
        answer = self._call("POST", "/meshes/%s/checkpoints/%s/restore"
                            % (quote(mesh), _step_text(step)), body)
        return Job(self, answer["job"], answer)

    def verify(self, mesh, step):
        """Starts a check of every chunk's checksum; returns its Job."""
        answer = self._call("POST", "/meshes/%s/checkpoints/%s/verify"
                            % (quote(mesh), _step_text(step)), {})
        return Job(self, answer["job"], answer)

    def export(self, mesh, step, dir, max_file_size=None):
        """Starts an export of `step` as Hugging Face safetensors files into `dir` (an
        absolute path the workers see, or s3://...), written by the mesh's workers;
        returns its Job. The Job's result names the files."""
        body = {"dir": os.fspath(dir)}
        if max_file_size is not None:
            body["max_file_size"] = max_file_size
        answer = self._call("POST", "/meshes/%s/checkpoints/%s/export"
                            % (quote(mesh), _step_text(step)), body)
        return Job(self, answer["job"], answer)

    def import_safetensors(self, mesh, source, step, metadata=None, compression=None, level=None):
        """Starts an import of safetensors files (a file, or a Hugging Face model folder,
        at an absolute path tesserad and the workers see) as checkpoint `step` of `mesh`;
        returns its Job. Restore it onto any mesh and layout."""
        body = {"source": os.fspath(source), "step": step}
        for key, value in (("metadata", metadata), ("compression", compression), ("level", level)):
            if value is not None:
                body[key] = value
        answer = self._call("POST", "/meshes/%s/imports" % quote(mesh), body)
        return Job(self, answer["job"], answer)

    def delete_checkpoint(self, mesh, step):
        self._call("DELETE", "/meshes/%s/checkpoints/%s" % (quote(mesh), _step_text(step)))

    def set_retention(self, mesh, keep_last=None, keep_every_n_steps=None):
        body = {}
        if keep_last is not None:
            body["keep_last"] = keep_last
        if keep_every_n_steps is not None:
            body["keep_every_n_steps"] = keep_every_n_steps
        return self._call("PUT", "/meshes/%s/retention" % quote(mesh), body)

    def collect_garbage(self):
        """Removes what failed saves left in the checkpoint root (tesserad also does
        this periodically); returns the removed paths."""
        return self._call("POST", "/gc", {})["removed"]

    # -- jobs

    def jobs(self, state=None, kind=None, mesh=None, limit=None, before=None):
        """One page of jobs, newest first: at most `limit` (1..1000, default 100),
        created before the job whose "seq" is `before`. iter_jobs() pages through all."""
        return self._call("GET", "/jobs" + query(
            {"state": state, "kind": kind, "mesh": mesh, "limit": limit, "before": before}))

    def iter_jobs(self, state=None, kind=None, mesh=None, page=1000):
        """Every job tesserad keeps (see its job history policy), newest first."""
        before = None
        while True:
            batch = self.jobs(state=state, kind=kind, mesh=mesh, limit=page, before=before)
            yield from batch
            if len(batch) < page:
                return
            before = batch[-1]["seq"]

    def job(self, job_id, wait_ms=None):
        """The job's JSON; with wait_ms, long-polls until it ends or wait_ms pass."""
        timeout = None if not wait_ms else self._http.timeout + wait_ms / 1000.0
        return self._call("GET", "/jobs/%s%s" % (quote(str(job_id)), query({"wait_ms": wait_ms})),
                          timeout=timeout)

    def wait_job(self, job_id, timeout=None):
        """Waits until the job ends; returns its final JSON if it succeeded.

        Raises TesseraError with the job's error (code, status of that code,
        details naming the culprit plus "job") if it failed or was cancelled, and
        deadline_exceeded (status 0) if `timeout` seconds pass first.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait_ms = _POLL_MS
            if deadline is not None:
                wait_ms = max(0, min(wait_ms, int((deadline - time.monotonic()) * 1000)))
            job = self.job(job_id, wait_ms=wait_ms)
            state = job.get("state")
            if state == "succeeded":
                return job
            if state in ("failed", "cancelled"):
                raise job_error(job)
            if deadline is not None and time.monotonic() >= deadline:
                raise TesseraError("deadline_exceeded", "job %s is still %s (phase %s) after %g s"
                                   % (job_id, state, job.get("phase"), timeout), 0,
                                   {"job": str(job_id)})

    def cancel_job(self, job_id):
        return self._call("POST", "/jobs/%s/cancel" % quote(str(job_id)), {})
