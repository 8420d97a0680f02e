"""A trainer process on one host of the multi-host tests, on its worker's local API
(TESSERA_WORKER). Prints one JSON line.

    trainer.py MESH RANK save STEP [--wait]   fill the state of STEP, save it
    trainer.py MESH RANK check STEP           restore STEP, compare with the state of STEP
    trainer.py MESH RANK expect STEP          compare what is attached with the state of STEP
    trainer.py MESH RANK all_reduce           sum of (rank + 1) over the mesh, on its workers
    trainer.py MESH RANK msave STEP [JSON]    fill the state of STEP, save it to memory
                                              (JSON: save()'s memory options), wait
    trainer.py MESH RANK mrestore             zero the state, restore the latest, compare
                                              with the state of the step restored
"""

import json
import sys

import numpy as np

import tessera

ROWS, COLS = 256, 64  # this rank's shard of "w": float32 (4 * ROWS, COLS) over data


def state(step, rank):
    w = np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS) + step * 1000 + rank * 1e6
    b = np.full(16, step, dtype=np.float32)
    return w, b


def attach(m, ranks):
    return (m.attach("w", (ranks * ROWS, COLS), "float32", ("data", None)),
            m.attach("b", (16,), "float32", None))


def main():
    mesh, rank, action = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    m = tessera.CheckpointManager(mesh)
    ranks = 4  # the tests' meshes have 4 ranks
    out = {"rank": rank}
    try:
        if action == "save":
            step = int(sys.argv[4])
            w, b = attach(m, ranks)
            w[...], b[...] = state(step, rank)
            h = m.save(step)
            out.update(job=h.job, snapshot_ms=h.snapshot_ms)
            if "--wait" in sys.argv:
                h.wait(timeout=60)
                out["committed"] = True
        elif action in ("check", "expect"):
            step = int(sys.argv[4])
            w, b = attach(m, ranks)
            if action == "check":
                w[...] = 0
                b[...] = 0
                out["restored"] = m.restore(step)
            want_w, want_b = state(step, rank)
            out["equal"] = bool(np.array_equal(w, want_w) and np.array_equal(b, want_b))
        elif action == "msave":
            step = int(sys.argv[4])
            options = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
            w, b = attach(m, ranks)
            w[...], b[...] = state(step, rank)
            h = m.save(step, tier="memory", **options)
            out["snapshot_ms"] = h.snapshot_ms
            h.wait(timeout=120)
            out["committed"] = True
        elif action == "mrestore":
            w, b = attach(m, ranks)
            w[...] = 0
            b[...] = 0
            r = m.restore(timeout=120)
            if r is None:  # nothing to restore: the tensors are left as they were
                out.update(restored=None, equal=not w.any() and not b.any())
            else:
                out.update(restored=int(r), tier=r.tier, source=r.source, fallback=r.fallback)
                want_w, want_b = state(int(r), rank)
                out["equal"] = bool(np.array_equal(w, want_w) and np.array_equal(b, want_b))
        elif action == "all_reduce":
            r = m.all_reduce(np.array([rank + 1.0], dtype=np.float32), reduce="sum")
            out["sum"] = float(np.asarray(r).reshape(-1)[0])
        else:
            raise SystemExit("unknown action " + action)
    except tessera.TesseraError as e:
        out.update(error=e.code, message=str(e), details=e.details)
    finally:
        m.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
