"""hosts.py itself: each host has its own /tmp and /dev/shm, yet sees the directories
it must keep (the checkout, wherever it is, and the hosts' own directory) at their
paths, spaces and symlinks included. Needs root."""

import os
import shutil
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from hosts import REPO, Hosts, can_run  # noqa: E402

WHY_NOT = can_run()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason="multi-host tests: %s" % WHY_NOT)


@pytest.fixture
def kept():
    """A directory with a space in its name under /tmp and one under /dev/shm, and a
    symlink under /tmp to the latter."""
    dirs = [tempfile.mkdtemp(prefix="tessera mh keep ", dir=d) for d in ("/tmp", "/dev/shm")]
    for d in dirs:
        with open(os.path.join(d, "f"), "w") as f:
            f.write(d)
    link = dirs[0] + " link"
    os.symlink(dirs[1], link)
    yield dirs + [link]
    os.unlink(link)
    for d in dirs:
        shutil.rmtree(d)


@pytest.mark.parametrize("share", ["bind", "sshfs"])
def test_hosts_keep_directories_under_their_private_tmp(kept, share):
    why = can_run(share)
    if why:
        pytest.skip(why)
    d = tempfile.mkdtemp(prefix="tessera mh dir ", dir="/tmp")  # the hosts' own, with a space
    with Hosts(2, dir=d, share=share, keep=kept) as hosts:
        for i in range(2):
            assert hosts.run(i, ["test", "-f", os.path.join(REPO, "tests", "multihost", "hosts.py")]) == ""
            for k in kept:
                f = os.path.join(k, "f")
                assert hosts.run(i, ["cat", f]) == open(f).read(), (i, f)
        # The same directory, not a copy: what a host writes there shows here.
        hosts.run(1, ["sh", "-c", 'echo 1 > "$1"', "sh", os.path.join(kept[2], "out")])
        assert open(os.path.join(kept[1], "out")).read() == "1\n"
        # The shared root, over sshfs for host 1 if so asked.
        assert hosts.mount_type(1, hosts.shared) == ("fuse.sshfs" if share == "sshfs" else None)
        hosts.run(1, ["sh", "-c", 'echo 2 > "$1"', "sh", os.path.join(hosts.shared, "s")])
        assert hosts.run(0, ["cat", os.path.join(hosts.shared, "s")]) == "2\n"
        assert open(os.path.join(hosts.shared_here, "s")).read() == "2\n"
        # The rest of /tmp is still each host's own.
        marker = "/tmp/tessera-mh-marker-%d" % os.getpid()
        hosts.run(0, ["sh", "-c", 'echo 1 > "$1"', "sh", marker])
        assert hosts.run(0, ["cat", marker]) == "1\n"
        assert hosts.run(1, ["sh", "-c", 'test -e "$1" && echo yes || echo no', "sh", marker]) == "no\n"
        assert not os.path.exists(marker)
    assert not os.path.exists(d)
