// S3Env: the Env seam over an S3 object store, for paths "s3://BUCKET/KEY".
//
// Files are objects; a directory is a key prefix ending in '/', which exists
// while some object (or unfinished multipart upload) is below it. There is no
// rename: checkpoints on an object store commit by publishing a manifest
// object with PublishFile (If-None-Match: *), see checkpoint_dir.h.
//
// Writes stream: a WritableFile sends each full part (part_bytes) as one part
// of a multipart upload, at most parts_in_flight at once, so a file never
// needs more than (parts_in_flight + 1) * part_bytes of memory. Sync()
// completes the upload (a file smaller than one part is a single PUT); a file
// closed or destroyed before Sync() aborts its upload, leaving nothing behind.
// Reads are ranged GETs, safe to issue from many threads at once.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "storage/env.h"

namespace tessera::storage {
namespace s3 {
class Transport;
}  // namespace s3

struct S3EnvOptions {
  // Where the store is; empty: TESSERA_S3_ENDPOINT. Credentials and region come
  // from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION.
  std::string endpoint;
  size_t part_bytes = 8 << 20;  // ≥ 5 MiB, S3's smallest part but the last
  int parts_in_flight = 4;      // per file
  int upload_threads = 8;       // per process, shared by every file
  int64_t retry_budget_ms = 30000;
  std::shared_ptr<s3::Transport> transport;  // null: s3::DefaultTransport(), libcurl
};

std::unique_ptr<Env> NewS3Env(S3EnvOptions options);

// True for "s3://..." paths.
bool IsS3Path(const std::string& path);

// The endpoint of DefaultEnv()'s object store: the one set here (--s3-endpoint,
// or what a worker learns from tesserad), else TESSERA_S3_ENDPOINT. A change
// takes effect for buckets not yet used in this process.
void SetDefaultS3Endpoint(const std::string& endpoint);
std::string DefaultS3Endpoint();

}  // namespace tessera::storage
