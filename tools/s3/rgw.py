"""tools/s3/rgw.sh from Python tests: a throwaway Ceph RGW with one bucket, its
endpoint, and its credentials exported to this process (and so to every process
it starts) until stop().

    store = Rgw("tessera-test", addr="10.1.2.1")   # addr: where the gateway listens
    store.endpoint, store.s3 (a boto3 client), store.bucket
    store.stop()
"""

import os
import shutil
import subprocess
import tempfile

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rgw.sh")


class Rgw:
    def __init__(self, bucket, addr="127.0.0.1"):
        import boto3  # python3-boto3
        self.bucket = bucket
        self.dir = tempfile.mkdtemp(prefix="tessera-rgw-", dir="/var/tmp")
        r = subprocess.run(["bash", SCRIPT, "start", self.dir, "0"], text=True,
                           env=dict(os.environ, TESSERA_RGW_ADDR=addr),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if r.returncode != 0:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise RuntimeError("tools/s3/rgw.sh start failed: " + r.stderr[-3000:])
        variables = dict(line[len("export "):].split("=", 1) for line in r.stdout.splitlines()
                         if line.startswith("export "))
        self.endpoint = variables.pop("TESSERA_S3_ENDPOINT")
        self._saved = {k: os.environ.get(k) for k in variables}
        os.environ.update(variables)  # credentials, for every process started from here
        # A session of its own: boto3's default one keeps the first credentials it found,
        # which a second gateway in the same process does not know.
        try:
            self.s3 = boto3.session.Session().client(
                "s3", endpoint_url=self.endpoint,
                region_name=variables.get("AWS_REGION", "us-east-1"),
                aws_access_key_id=variables.get("AWS_ACCESS_KEY_ID"),
                aws_secret_access_key=variables.get("AWS_SECRET_ACCESS_KEY"))
            self.s3.create_bucket(Bucket=bucket)
        except BaseException:
            self.stop()  # no gateway outlives a failed start
            raise

    def stop(self):
        for k, v in self._saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        subprocess.run(["bash", SCRIPT, "stop", self.dir], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        shutil.rmtree(self.dir, ignore_errors=True)
