"""The S3 peer: boto3's upload_file and download_file (managed transfers: multipart,
8 MiB parts, 10 threads, as shipped) of the same number of bytes that the cluster
benchmark checkpoints, to the same RGW, in the same run. One JSON line per transfer.

  /usr/bin/python3 bench/s3_boto3.py --endpoint URL --bucket B --dir TMP [--bytes N] [--repeat 3]

Credentials and region come from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_REGION.
The file is written (synthetic float32 weights, like the cluster's) and read back
from the page cache, as the cluster's trainers hold their state in memory."""

import argparse
import json
import os
import time

import boto3
import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--bucket", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--bytes", type=int, default=1 << 30)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    s3 = boto3.client("s3", endpoint_url=a.endpoint,
                      region_name=os.environ.get("AWS_REGION", "us-east-1"))
    src = os.path.join(a.dir, "boto3-src.bin")
    dst = os.path.join(a.dir, "boto3-dst.bin")
    rng = np.random.default_rng(1)
    with open(src, "wb") as f:
        left = a.bytes
        while left > 0:
            n = min(left, 64 << 20)
            f.write((rng.standard_normal(n // 4, dtype=np.float32) * 0.02).tobytes()[:n])
            left -= n
    for rep in range(a.repeat):
        key = "boto3/state-%d.bin" % rep
        t0 = time.perf_counter()
        s3.upload_file(src, a.bucket, key)
        up = time.perf_counter() - t0
        print(json.dumps({"bench": "s3_boto3", "op": "upload", "rep": rep, "bytes": a.bytes,
                          "time_s": up, "GBps": a.bytes / up / 1e9}), flush=True)
        t0 = time.perf_counter()
        s3.download_file(a.bucket, key, dst)
        down = time.perf_counter() - t0
        print(json.dumps({"bench": "s3_boto3", "op": "download", "rep": rep, "bytes": a.bytes,
                          "time_s": down, "GBps": a.bytes / down / 1e9}), flush=True)
        os.unlink(dst)
        s3.delete_object(Bucket=a.bucket, Key=key)
    os.unlink(src)


if __name__ == "__main__":
    main()
