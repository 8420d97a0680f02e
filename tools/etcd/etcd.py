"""tools/etcd/etcd.sh from Python tests: a throwaway single-member etcd on a free
port, in a temporary directory removed by stop().

    with Etcd() as etcd:                 # addr: where it listens (127.0.0.1)
        etcd.url                         # "etcd://127.0.0.1:PORT", as tesserad takes it
        etcd.endpoint                    # "http://127.0.0.1:PORT", for etcdctl --endpoints
        etcd.get("key")                  # the value as a str, or None
"""

import base64
import json
import os
import shutil
import subprocess
import tempfile
import urllib.request

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "etcd.sh")


class Etcd:
    def __init__(self, addr="127.0.0.1"):
        self.dir = tempfile.mkdtemp(prefix="tessera-etcd-")
        r = subprocess.run(["bash", SCRIPT, "start", self.dir, "0", addr], text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if r.returncode != 0:
            self.stop()
            raise RuntimeError("tools/etcd/etcd.sh start failed: " + r.stderr[-3000:])
        variables = dict(line[len("export "):].split("=", 1) for line in r.stdout.splitlines()
                         if line.startswith("export "))
        self.url = variables["TESSERA_ETCD"]
        self.endpoint = "http://" + self.url[len("etcd://"):]

    def get(self, key):
        """The value of `key` (str or bytes) as a str, or None if there is no such key;
        read through etcd's v3 JSON gateway (POST /v3/kv/range, base64 keys and values)."""
        raw = key.encode() if isinstance(key, str) else bytes(key)
        request = urllib.request.Request(
            self.endpoint + "/v3/kv/range", method="POST",
            data=json.dumps({"key": base64.b64encode(raw).decode()}).encode(),
            headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                kvs = json.load(answer).get("kvs") or []
        except (OSError, ValueError) as e:  # urllib.error.URLError is an OSError
            raise RuntimeError("etcd %s: reading key %r failed: %s" % (self.endpoint, key, e)) \
                from None
        if not kvs:
            return None
        # An empty value has no "value" field.
        return base64.b64decode(kvs[0].get("value", "")).decode()

    def stop(self):
        """Stops etcd (waiting until it has exited) and removes its directory."""
        if self.dir is None:
            return
        subprocess.run(["bash", SCRIPT, "stop", self.dir], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
