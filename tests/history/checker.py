"""The checker: properties proven over a whole history (history.py), nothing else read.

1. durable:   every persisted checkpoint reported committed (a save's ok, or listed
              committed in the root) that nobody may have deleted (a REST delete that
              succeeded or may have, or retention by a policy that may have been in
              effect and allowed it) is listed at the end, restores bit for bit as its
              save wrote it, and verifies.
2. restores:  every restore returned, on every rank, exactly the state some save wrote
              (its tag names the save), the same step on every rank, the step asked
              for; and a restore of the latest returned a state of the job's own
              lineage, never one of an abandoned timeline past the rollback point.
3. no hang:   every operation answered within its timeout.
4. conflict:  no save failed `conflict` unless a delete of the mesh or a kill came
              between the mesh's last committed save (for a disk save: its last
              committed disk save, its base) and its answer.

An indeterminate save (info, or a failure) may or may not have committed: it is never
required, but if it is listed at the end it must restore as its save wrote it.
"""

import collections


def _owner(lineage, step):
    for timeline, last in lineage:
        if last is None or step <= last:
            return timeline
    return None


class Checker:
    def __init__(self, events, job_of_mesh):
        self.events = events
        self.job_of_mesh = job_of_mesh
        self.completion = {}
        for e in events:
            if e["type"] != "invoke":
                self.completion[e["invoke"]] = e
        self.violations = []
        self.notes = []

    def ops(self, f=None):
        """(invocation, completion or None) of every operation named f."""
        for e in self.events:
            if e["type"] == "invoke" and (f is None or e["f"] == f):
                yield e, self.completion.get(e["index"])

    def fail(self, prop, message, *indices):
        self.violations.append({"property": prop, "ops": list(indices), "message": message})

    # -- what the history says happened

    def saves(self):
        """{(mesh, step): (invocation, completion)}."""
        return {(i["value"]["mesh"], i["value"]["step"]): (i, c) for i, c in self.ops("save")}

    def maybe_deleted(self):
        out = set()
        for i, c in self.ops("delete"):
            if c is None or c["type"] in ("ok", "info", "hang"):
                out.add((i["value"]["mesh"], i["value"]["step"]))
        return out

    def retention_may_remove(self, mesh, step, saves):
        """Whether a retention policy that may have been in effect after step's save began
        allows pruning it: a step not divisible by keep_every_n_steps, with at least
        keep_last disk saves of later steps begun (an upper bound of the committed ones)."""
        save_invoke = saves[(mesh, step)][0]["index"] if (mesh, step) in saves else 0
        later = sum(1 for (m, s), (i, _) in saves.items()
                    if m == mesh and s > step and i["value"]["kind"] != "memory")
        policies = []
        for i, c in self.ops("retention"):
            if i["value"]["mesh"] != mesh:
                continue
            if c is not None and c["type"] == "ok" and c["index"] < save_invoke:
                policies = [i["value"]]  # in effect until a later one may have replaced it
            elif c is None or c["type"] != "fail":
                policies.append(i["value"])
        for p in policies:
            every = p.get("keep_every_n_steps")
            if (not every or step % every != 0) and later >= p["keep_last"]:
                return True
        return False

    # -- the properties

    def check(self):
        saves = self.saves()
        self.check_hangs()
        self.check_restores(saves)
        self.check_durable(saves)
        self.check_conflicts()
        return self.violations

    def check_hangs(self):
        for i, c in self.ops():
            if c is not None and c["type"] == "hang":
                self.fail("no hang", "%s %s %s gave no answer within %s s" % (
                    i["process"], i["f"], i["value"], c["value"]["timeout_s"]), i["index"])

    def check_restores(self, saves):
        for f in ("restore", "rollback", "final-restore"):
            for i, c in self.ops(f):
                if c is None or c["type"] != "ok" or c["value"]["step"] is None:
                    continue
                self.check_restore(i, c, saves)

    def check_restore(self, i, c, saves):
        mesh, asked = i["value"]["mesh"], i["value"]["step"]
        ranks = c["value"]["ranks"]
        steps = {r["step"] for r in ranks}
        what = "%s %s of %s (op %d)" % (i["f"], "latest" if asked is None else asked, mesh,
                                        i["index"])
        if len(steps) != 1:
            self.fail("restores", "%s: ranks restored different steps %s" % (what, sorted(steps)),
                      i["index"])
        for rank, r in enumerate(ranks):
            job, timeline, step = r["tag"]
            if job != self.job_of_mesh[mesh] or step != r["step"] or not r["intact"]:
                self.fail("restores", "%s: rank %d answered step %d (tier %s, source %s) but "
                          "holds tag %s, %s" % (what, rank, r["step"], r["tier"], r["source"],
                                                r["tag"], "intact" if r["intact"] else
                                                "tensors that are not that tag's state"),
                          i["index"])
                continue
            if asked is not None and step != asked:
                self.fail("restores", "%s: rank %d restored step %d" % (what, rank, step),
                          i["index"])
            save = saves.get((mesh, step))
            if save is None or save[0]["value"]["timeline"] != timeline:
                self.fail("restores", "%s: rank %d holds (timeline %d, step %d), which no save "
                          "wrote" % (what, rank, timeline, step), i["index"])
                continue
            if asked is None and i["f"] == "restore" and rank == 0:  # ranks agree (above)
                owner = _owner(i["value"]["lineage"], step)
                if owner != timeline:
                    save_i, save_c = save
                    if save_c is None or save_c["type"] != "ok":
                        self.notes.append("%s: rank %d restored step %d of abandoned timeline "
                                          "%d, whose save (op %d) was indeterminate: excused"
                                          % (what, rank, step, timeline, save_i["index"]))
                        continue
                    self.fail("restores", "%s on timeline %d: restored step %d (tier/source "
                              "by rank: %s) of abandoned timeline %d, written by save op %d (%s) "
                              "after the rollback point; the lineage was %s" % (
                                  what, i["value"]["timeline"], step,
                                  ", ".join("%s/%s" % (x["tier"], x["source"]) for x in ranks),
                                  timeline, save_i["index"], save_i["value"]["kind"],
                                  i["value"]["lineage"]), i["index"], save_i["index"])

    def check_durable(self, saves):
        final = {}
        for i, c in self.ops("final-list"):
            if c is None or c["type"] != "ok":
                self.fail("durable", "the final listing of %s failed: %s" % (
                    i["value"]["mesh"], c and c.get("error")), i["index"])
                continue
            final[i["value"]["mesh"]] = {x["step"] for x in c["value"]
                                         if x["state"] == "committed" and
                                         "persisted" in x["tiers"]}
        restored = collections.defaultdict(list)
        for i, c in self.ops("final-restore"):
            restored[(i["value"]["mesh"], i["value"]["step"])].append((i, c))
        verified = collections.defaultdict(list)
        for i, c in self.ops("verify"):
            verified[(i["value"]["mesh"], i["value"]["step"])].append((i, c))

        committed = {}
        for (mesh, step), (i, c) in saves.items():
            if c is not None and c["type"] == "ok" and i["value"]["kind"] != "memory":
                committed[(mesh, step)] = c["index"]
        for i, c in self.ops("list"):
            if c is not None and c["type"] == "ok":
                for x in c["value"]:
                    if x["state"] == "committed" and "persisted" in x["tiers"]:
                        committed.setdefault((i["value"]["mesh"], x["step"]), c["index"])
        deleted = self.maybe_deleted()
        for (mesh, step), seen in sorted(committed.items()):
            if mesh not in final or step in final[mesh] or (mesh, step) in deleted:
                continue
            if self.retention_may_remove(mesh, step, saves):
                continue
            self.fail("durable", "step %d of %s was reported committed (op %d) and neither "
                      "deleted nor allowed to retention, but is not listed at the end"
                      % (step, mesh, seen), seen)

        for mesh, steps in final.items():
            for step in sorted(steps):
                if (mesh, step) not in saves:
                    self.fail("durable", "step %d of %s is listed but no save wrote it"
                              % (step, mesh))
                    continue
                for i, c in restored.get((mesh, step), []):
                    if c is None or c["type"] != "ok":
                        self.fail("durable", "step %d of %s is listed at the end but its restore "
                                  "(op %d) failed: %s" % (step, mesh, i["index"],
                                                          c and c.get("error")), i["index"])
                for i, c in verified.get((mesh, step), []):
                    if c is None or c["type"] != "ok" or not c["value"].get("ok"):
                        self.fail("durable", "step %d of %s is listed at the end but verify "
                                  "(op %d) says %s" % (step, mesh, i["index"],
                                                       c and (c.get("error") or c["value"])),
                                  i["index"])

    def check_conflicts(self):
        # The turbulence since a mesh's last committed save counts; for a disk save, since
        # its last committed disk save (its base), whatever memory saves came between.
        last_ok, last_disk_ok = {}, {}
        for i, c in self.ops("save"):
            mesh = i["value"]["mesh"]
            disk = i["value"].get("kind") != "memory"
            start = (last_disk_ok if disk else last_ok).get(mesh, 0)
            if c is not None and c["type"] == "ok":
                last_ok[mesh] = i["index"]
                if disk:
                    last_disk_ok[mesh] = i["index"]
            if c is None or c["type"] == "ok" or (c.get("error") or {}).get("code") != "conflict":
                continue
            window = self.events[start:c["index"] + 1]
            excused = [e["index"] for e in window if e["type"] == "invoke" and (
                e["f"] in ("kill", "restart") or
                (e["f"] == "delete" and e["value"]["mesh"] == mesh))]
            if not excused:
                self.fail("conflict", "save of step %d of %s (op %d) failed conflict with no "
                          "delete of the mesh and no kill since its last committed save (op %d): %s"
                          % (i["value"]["step"], mesh, i["index"], start,
                             c["error"]["message"]), i["index"])


def load(path):
    """A Checker of a kept history file (its meshes are history-<job>)."""
    import json  # noqa: PLC0415
    with open(path) as f:
        events = [json.loads(line) for line in f]
    meshes = {e["value"]["mesh"] for e in events
              if e["type"] == "invoke" and isinstance(e.get("value"), dict) and
              "mesh" in e["value"]}
    return Checker(events, {m: int(m.rsplit("-", 1)[1]) for m in meshes})


def main(argv):
    """python3 tests/history/checker.py HISTORY.jsonl: checks a kept history again."""
    checker = load(argv[1])
    violations = checker.check()
    for note in checker.notes:
        print("note: " + note)
    for v in violations:
        print("[%s] %s" % (v["property"], v["message"]))
    print("%d violation(s)" % len(violations))
    return 1 if violations else 0


if __name__ == "__main__":
    import sys  # noqa: PLC0415
    sys.exit(main(sys.argv))
