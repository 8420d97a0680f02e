"""The "Cluster on S3" section of bench/RESULTS.md: the cluster checkpointing into a Ceph
RGW (bench/out/s3_cluster.jsonl), next to boto3's transfers to the same gateway
(s3_boto3_<i>.jsonl, bench/s3_boto3.py) and the cluster's POSIX figures (cluster.jsonl).
Standard library only (bench/report.py runs it with Debian's /usr/bin/python3)."""
from report_common import med, runs_text

S3_VS_BOTO3 = 1.0  # save and restore through the cluster ≥ 1.0x boto3 upload_file/download_file


def s3_section(w, ours, boto, posix, steps):
    """The cluster checkpointing into a Ceph RGW, next to boto3's managed transfers of
    the same number of bytes to the same gateway, and the cluster's POSIX figures."""
    w("## Cluster on S3: tesserad + 4 workers → Ceph RGW, against boto3")
    w("")
    skipped = [r["skipped"] for r in steps if "skipped" in r]
    if skipped or not ours or not boto:
        why = "; ".join(skipped) or "no results (see bench/out/s3_*.jsonl and rgw.log)"
        w(f"Not measured in this session: {why}.")
        w("")
        return
    w("The same 1.00 GiB state as above, with `--checkpoint-root s3://tessera-bench/cluster` on "
      "a throwaway single-node Ceph (tools/s3/rgw.sh: one monitor, one memstore OSD, radosgw) "
      "on this machine. The peer is boto3's `upload_file` / `download_file` (multipart, 8 MiB "
      "parts, 10 threads, as shipped) of a 1 GiB file of the same kind of data, to the same "
      "gateway, in two runs around ours. Ours: each worker streams its shard in 8 MiB parts, 4 "
      "at a time; a restore reads 4 MiB chunks with ranged GETs on each worker's I/O threads "
      "and verifies every checksum. The gateway and the OSD share the 2 vCPUs with the client "
      "in both cases, so both are bound by the server.")
    w("")
    by = lambda b, op=None: [r for r in ours if r.get("bench") == b and
                             (op is None or r.get("compression") == op)]
    up = med([r["GBps"] for r in boto if r.get("op") == "upload"])
    down = med([r["GBps"] for r in boto if r.get("op") == "download"])
    p_save = med([r["GBps"] for r in posix if r.get("bench") == "save" and r.get("compression") == "none"])
    p_restore = med([r["GBps"] for r in posix if r.get("bench") == "restore"])
    w("| target | ours (S3) | boto3 | ratio | needed | verdict | ours, POSIX root (above) |")
    w("|---|---:|---:|---:|---:|---|---:|")
    for label, rows, peer, posix_fig in (
            ("save, no compression (trainer call → commit) vs upload_file", by("s3_save", "none"), up, p_save),
            ("save, zstd-1 vs upload_file", by("s3_save", "zstd"), up, None),
            ("restore (REST call → job end) vs download_file", by("s3_restore"), down, p_restore)):
        g = med([r["GBps"] for r in rows])
        if g is None or peer is None:
            continue
        r_ = g / peer
        pf = f"{posix_fig:.3f} GB/s" if posix_fig else "—"
        w(f"| {label} | {g:.3f} GB/s | {peer:.3f} GB/s | {r_:.2f}× | ≥ {S3_VS_BOTO3:.1f}× | "
          f"{'met' if r_ >= S3_VS_BOTO3 else '**not met**'} | {pf} |")
    w("")
    w("Every run, in order (GB/s):")
    w("")
    w(f"- boto3 upload_file: {runs_text([r['GBps'] for r in boto if r.get('op') == 'upload'])}")
    w(f"- boto3 download_file: {runs_text([r['GBps'] for r in boto if r.get('op') == 'download'])}")
    for c in ("none", "zstd"):
        w(f"- ours, save ({c}): {runs_text([r['GBps'] for r in by('s3_save', c)])}; write phase "
          f"{', '.join(str(r.get('phases_ms', {}).get('write', '?')) + ' ms' for r in by('s3_save', c))}")
    w(f"- ours, restore: {runs_text([r['GBps'] for r in by('s3_restore')])}")
    w("")
