"""ddp_train.py as 4 DDP ranks on tesserad + 4 workers: a run whose rank 2 is
SIGKILLed mid-run, and which is then started again, resumes from the step the
workers agree on and ends with the same losses and the same model and optimizer
state, bit for bit, as a run that never stopped."""

import os
import re

import ddp_run
import tessera

STEPS = 16
ARGS = ["--steps", str(STEPS), "--save-every", "5"]
STEP_LINE = re.compile(r"^step (\d+) loss (\S+)$", re.M)
STATE_LINE = re.compile(r"^state (\w+) tokens (\d+)$", re.M)


def read(log_dir, rank):
    with open(os.path.join(log_dir, "rank-%d.log" % rank)) as f:
        return f.read()


def run(cluster, mesh, log_dir, extra_for=None):
    extra = {r: ARGS + list((extra_for or {}).get(r, [])) for r in range(4)}
    return ddp_run.supervise(ddp_run.start_ranks(cluster, mesh, log_dir, extra=extra), 240)


def rank_out(log_dir):
    texts = []
    for r in range(4):
        with open(os.path.join(log_dir, "rank-%d.out" % r)) as f:
            texts.append(f.read()[-3000:])
    return texts


def test_a_killed_ddp_run_resumes_bit_exact(cluster, tmp_path):
    dir_a, dir_b = str(tmp_path / "a"), str(tmp_path / "b")
    os.makedirs(dir_a)
    os.makedirs(dir_b)
    ddp_run.register(cluster, "gpt-a")
    assert run(cluster, "gpt-a", dir_a) == [0] * 4, rank_out(dir_a)
    a = [read(dir_a, r) for r in range(4)]
    losses_a = [dict(STEP_LINE.findall(t)) for t in a]
    state_a = [STATE_LINE.findall(t) for t in a]
    assert all(len(s) == 1 for s in state_a)
    assert len({s[0] for s in state_a}) == 1  # DDP: every rank holds the same state
    assert list(losses_a[0]) == [str(s) for s in range(1, STEPS + 1)]

    # Rank 2 dies after step 13; the launcher stops the other ranks, as torchrun does.
    ddp_run.register(cluster, "gpt-b")
    codes = run(cluster, "gpt-b", dir_b, {2: ["--die-at-step", "13"]})
    assert codes[2] == -9 and all(c != 0 for c in codes), codes
    client = cluster.client()
    for job in client.jobs(mesh="gpt-b", state="running"):
        try:
            client.wait_job(job["id"], timeout=60)
        except tessera.TesseraError:
            pass  # a save the kill cut short fails; the committed ones stay
    assert client.latest_step("gpt-b") == 10

    assert run(cluster, "gpt-b", dir_b) == [0] * 4, rank_out(dir_b)
    for r in range(4):
        text = read(dir_b, r)
        assert "resume from 10\n" in text, text
        for step, loss in STEP_LINE.findall(text):  # before the kill and after the resume
            assert loss == losses_a[r][step], (r, step)
        assert [int(s) for s, _ in STEP_LINE.findall(text.split("resume from 10\n")[1])] == \
            list(range(11, STEPS + 1))
        assert STATE_LINE.findall(text) == state_a[r]
    assert client.latest_step("gpt-b") == 15
    assert client.checkpoint("gpt-b", 15)["metadata"]["tokens"] == 15 * 4 * 8 * 16
