"""train.py as 4 processes on tesserad + 4 workers: a run killed with SIGKILL and
resumed logs the same losses, bit for bit, as one that never stopped; a trainer
killed right after save() returned leaves that checkpoint committed."""

import os
import re
import time

import pytest

import run

STEPS = 24
ARGS = ["--steps", str(STEPS), "--save-every", "5", "--timeout-ms", "4000"]
STEP_LINE = re.compile(r"^step (\d+) loss (\S+) global (\S+)$", re.M)


def losses(log_dir, rank):
    """Every (step, loss, global loss) line the rank logged, in order (repeats included)."""
    with open(os.path.join(log_dir, "rank-%d.log" % rank)) as f:
        return [(int(s), a, b) for s, a, b in STEP_LINE.findall(f.read())]


def text(log_dir, name):
    with open(os.path.join(log_dir, name)) as f:
        return f.read()


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting for " + what
        time.sleep(0.005)


@pytest.fixture(scope="module")
def run_a(cluster, tmp_path_factory):
    """The uninterrupted run: its losses by rank, {step: (loss, global)}."""
    log_dir = str(tmp_path_factory.mktemp("run-a"))
    run.register(cluster, "run-a")
    codes = run.wait_all(run.start_trainers(cluster, "run-a", log_dir,
                                            extra={r: ARGS for r in range(4)}), 120)
    assert codes == [0, 0, 0, 0], [text(log_dir, "rank-%d.out" % r) for r in range(4)]
    out = []
    for rank in range(4):
        lines = losses(log_dir, rank)
        assert [s for s, _, _ in lines] == list(range(1, STEPS + 1))
        out.append({s: (a, b) for s, a, b in lines})
    # Data parallel: the averaged loss is the same on every rank, the local ones differ.
    assert all(out[r][STEPS][1] == out[0][STEPS][1] for r in range(4))
    assert len({out[r][STEPS][0] for r in range(4)}) == 4
    assert cluster.client().latest_step("run-a") == 20
    return out


def test_sigkill_mid_run_then_resume_is_bit_exact(cluster, run_a, tmp_path):
    log_dir = str(tmp_path)
    run.register(cluster, "run-b")
    paced = ARGS + ["--step-delay-ms", "40"]
    procs = run.start_trainers(cluster, "run-b", log_dir, extra={r: paced for r in range(4)})
    # Kill rank 2 mid-run, once step 10 has been saved and it has gone a little further.
    wait_for(lambda: os.path.exists(os.path.join(log_dir, "rank-2.log")) and
             any(s == 12 for s, _, _ in losses(log_dir, 2)), 90, "rank 2 at step 12")
    procs[2].kill()
    # The others fail on their next all-reduce, which names the worker that never
    # came (wait_all fails the test if they are still running after 30 s).
    codes = run.wait_all(procs, 30)
    assert codes[2] == -9 and all(codes[r] == 3 for r in (0, 1, 3)), codes
    assert "w-host2" in text(log_dir, "rank-0.out")
    killed_at = max(s for s, _, _ in losses(log_dir, 2))
    assert killed_at < STEPS

    client = cluster.client()
    wait_for(lambda: not client.jobs(state="running", mesh="run-b"), 30, "running saves to end")
    latest = client.latest_step("run-b")
    assert latest is not None and 10 <= latest <= killed_at

    codes = run.wait_all(run.start_trainers(cluster, "run-b", log_dir,
                                            extra={r: ARGS for r in range(4)}), 120)
    assert codes == [0, 0, 0, 0], [text(log_dir, "rank-%d.out" % r) for r in range(4)]
    for rank in range(4):
        assert "resume from %d\n" % latest in text(log_dir, "rank-%d.log" % rank)
        lines = losses(log_dir, rank)
        resumed = [s for s, _, _ in lines if s > latest]
        assert resumed[-(STEPS - latest):] == list(range(latest + 1, STEPS + 1))
        for step, loss, global_loss in lines:  # before the kill and after the resume
            assert (loss, global_loss) == run_a[rank][step], (rank, step)
    assert client.latest_step("run-b") == 20


def test_sigkill_right_after_save_leaves_the_checkpoint_committed(cluster, run_a, tmp_path):
    log_dir = str(tmp_path)
    run.register(cluster, "run-c")
    extra = {r: ARGS for r in range(4)}
    extra[1] = ARGS + ["--crash-after-save", "10"]
    codes = run.wait_all(run.start_trainers(cluster, "run-c", log_dir, extra=extra), 60)
    assert codes[1] == -9 and all(codes[r] == 3 for r in (0, 2, 3)), codes
    log = text(log_dir, "rank-1.log")
    assert log.rstrip().splitlines()[-1].startswith("saved 10 ")  # nothing after save()

    client = cluster.client()

    def state():
        return [c["state"] for c in client.checkpoints("run-c") if c["step"] == 10]
    wait_for(lambda: state() in (["committed"], ["failed"]), 30, "step 10 to end")
    assert state() == ["committed"]
    assert client.latest_step("run-c") == 10
    assert client.verify("run-c", 10).wait(timeout=30)["state"] == "succeeded"
    detail = client.checkpoint("run-c", 10)
    assert float.fromhex(run_a[0][10][1]) == detail["metadata"]["rank0_loss"]
