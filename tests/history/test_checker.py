"""The checker on kept histories (testdata/), no cluster needed: each history of a
failure found against a real cluster must still be found, and a clean one must pass."""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import checker  # noqa: E402

KEPT = {
    # seed 42, no kills: memory save 17, disk 18-20, memory 21; restore(17) and delete
    # 18-20; restore() then returns step 21 of the abandoned timeline from memory.
    "memory-restore-from-abandoned-timeline.jsonl": ("restores", "of abandoned timeline"),
    # seed 7, S3 root: after a kill, a failed memory checkpoint's share of step 6 reaches
    # rank 3 in step 8, which fails `conflict` with every trainer on the same steps.
    "memory-stale-share-aborts-next-save.jsonl": ("conflict", "sent its share of step 6"),
    "clean.jsonl": None,
}


def check(name):
    return checker.load(os.path.join(HERE, "testdata", name)).check()


@pytest.mark.parametrize("name", sorted(KEPT))
def test_checker_on_kept_history(name):
    violations = check(name)
    if KEPT[name] is None:
        assert violations == []
        return
    prop, text = KEPT[name]
    assert any(v["property"] == prop and text in v["message"] for v in violations), violations
