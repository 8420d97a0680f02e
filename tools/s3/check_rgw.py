#!/usr/bin/python3
"""Smoke test of an S3 endpoint (as started by tools/s3/rgw.sh) for what Tessera's S3
store relies on: buckets, multipart upload, ranged GET, listing, delete, and PUT with
If-None-Match: * (the exactly-once commit of a checkpoint), including under a race.

    eval "$(bash tools/s3/rgw.sh start /tmp/rgw 0)"
    /usr/bin/python3 tools/s3/check_rgw.py

Uses Debian's python3-boto3. Prints one line per check; exits non-zero on the first
failure.
"""
import os
import sys
import tempfile
import threading
import time

import boto3
import botocore.config
import botocore.exceptions
from boto3.s3.transfer import TransferConfig

MIB = 1 << 20


def client():
    return boto3.client(
        "s3",
        endpoint_url=os.environ["TESSERA_S3_ENDPOINT"],
        region_name=os.environ.get("AWS_REGION", "us-east-1"),
        # Path style, as Tessera's client uses: no DNS for bucket.127.0.0.1.
        config=botocore.config.Config(s3={"addressing_style": "path"},
                                      retries={"max_attempts": 1}),
    )


def put_if_absent(s3, bucket, key, body):
    """PUT with If-None-Match: *; boto3 1.26 has no parameter for it, so the header is
    added before signing. Returns the HTTP status."""
    def add_header(request, **_):
        request.headers["If-None-Match"] = "*"

    event = "before-sign.s3.PutObject"
    s3.meta.events.register(event, add_header)
    try:
        return s3.put_object(Bucket=bucket, Key=key, Body=body)[
            "ResponseMetadata"]["HTTPStatusCode"]
    except botocore.exceptions.ClientError as e:
        return e.response["ResponseMetadata"]["HTTPStatusCode"], e.response["Error"].get("Code")
    finally:
        s3.meta.events.unregister(event, add_header)


def check(what, ok, detail=""):
    print(f"{'ok' if ok else 'FAIL'}: {what}{' — ' + str(detail) if detail else ''}", flush=True)
    if not ok:
        sys.exit(1)


def main():
    s3 = client()
    bucket = f"tessera-check-{os.getpid()}"
    s3.create_bucket(Bucket=bucket)
    check("create bucket", bucket in [b["Name"] for b in s3.list_buckets()["Buckets"]], bucket)

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "src"), os.path.join(tmp, "dst")
        with open(src, "wb") as f:
            f.write(os.urandom(20 * MIB))
        cfg = TransferConfig(multipart_threshold=8 * MIB, multipart_chunksize=8 * MIB)
        t = time.monotonic()
        s3.upload_file(src, bucket, "big/obj", Config=cfg)
        up = time.monotonic() - t
        etag = s3.head_object(Bucket=bucket, Key="big/obj")["ETag"]
        check("20 MiB multipart upload", etag.endswith('-3"'), f"ETag {etag}, {up:.2f}s")
        t = time.monotonic()
        s3.download_file(bucket, "big/obj", dst, Config=cfg)
        down = time.monotonic() - t
        same = open(src, "rb").read() == open(dst, "rb").read()
        check("download matches", same, f"{down:.2f}s")
        want = open(src, "rb").read()[5 * MIB:5 * MIB + 100]
        got = s3.get_object(Bucket=bucket, Key="big/obj", Range=f"bytes={5 * MIB}-{5 * MIB + 99}")
        check("ranged GET", got["Body"].read() == want and got["ContentLength"] == 100)

    size = s3.head_object(Bucket=bucket, Key="big/obj")["ContentLength"]
    check("HEAD size", size == 20 * MIB, size)

    for i in range(3):
        s3.put_object(Bucket=bucket, Key=f"small/{i}", Body=b"x" * i)
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="small/",
                                                        PaginationConfig={"PageSize": 2})
    keys = [(o["Key"], o["Size"]) for p in pages for o in p.get("Contents", [])]
    check("list v2 with prefix, 2 per page", keys == [("small/0", 0), ("small/1", 1), ("small/2", 2)],
          keys)

    # Conditional put: the first succeeds, a second on the same key must be refused.
    st = put_if_absent(s3, bucket, "commit/a", b"first")
    check("If-None-Match: * on a new key", st == 200, st)
    st = put_if_absent(s3, bucket, "commit/a", b"second")
    check("If-None-Match: * on an existing key", st == (412, "PreconditionFailed"), st)
    body = s3.get_object(Bucket=bucket, Key="commit/a")["Body"].read()
    check("existing object kept", body == b"first", body)

    # The same under a race: of N writers of one new key, exactly one may win.
    for round_ in range(10):
        key, results = f"race/{round_}", []
        clients = [client() for _ in range(8)]
        threads = [threading.Thread(target=lambda c=c, n=n: results.append(
            (put_if_absent(c, bucket, key, f"writer {n}".encode()), n)))
            for n, c in enumerate(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [n for st, n in results if st == 200]
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode()
        if len(winners) != 1 or body != f"writer {winners[0]}":
            check(f"race of 8 conditional puts, round {round_}", False,
                  f"statuses {sorted(str(st) for st, _ in results)}, object holds {body!r}")
    check("10 races of 8 conditional puts: exactly one winner each", True)

    # Multipart left open is listed, then aborted.
    up = s3.create_multipart_upload(Bucket=bucket, Key="open/x")["UploadId"]
    s3.upload_part(Bucket=bucket, Key="open/x", UploadId=up, PartNumber=1, Body=b"y" * 5 * MIB)
    ups = s3.list_multipart_uploads(Bucket=bucket, Prefix="open/").get("Uploads", [])
    check("list multipart uploads", [(u["Key"], u["UploadId"]) for u in ups] == [("open/x", up)])
    s3.abort_multipart_upload(Bucket=bucket, Key="open/x", UploadId=up)
    ups = s3.list_multipart_uploads(Bucket=bucket, Prefix="open/").get("Uploads", [])
    check("abort multipart upload", ups == [])

    st = s3.delete_object(Bucket=bucket, Key="no/such/key")["ResponseMetadata"]["HTTPStatusCode"]
    check("delete of a missing key", st == 204, st)
    left = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]
    for k in left:
        s3.delete_object(Bucket=bucket, Key=k)
    s3.delete_bucket(Bucket=bucket)
    gone = bucket not in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    check("delete objects and bucket", gone, f"{len(left)} objects")
    try:
        s3.head_bucket(Bucket=bucket)
        check("deleted bucket is gone", False)
    except botocore.exceptions.ClientError as e:
        check("deleted bucket is gone", e.response["Error"]["Code"] in ("404", "NoSuchBucket"))


if __name__ == "__main__":
    main()
