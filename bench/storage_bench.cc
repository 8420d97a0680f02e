// tessera_bench_storage: throughput of the local storage engine on this machine,
// measured the way the peer scripts in bench/peers measure fio and
// torch.save/torch.load, so that bench/report.py can put the figures side by side.
//
//   save   SaveCheckpoint of the state of save_torch.py (64 tensors, 1.00 GiB of
//          float32 at --scale 1) and of its bfloat16 truncation, zstd-1 and
//          uncompressed, with a ThreadPool of 1 and of 2 threads (they checksum and
//          compress while the calling thread writes); the timed call covers
//          chunking, encoding, writing, fsync, index merge and the atomic commit.
//   read   every tensor back whole (PlanRead + ExecuteRead) into preallocated
//          buffers, with a cold page cache and then a warm one; the bytes read
//          are compared with the bytes saved.
//   index  MergeFragments of 256 fragments × 1000 tensors, then CheckpointIndex::Open.
//
// With --json every result is one JSON object per line ("bench": "tessera"),
// like the peers' scripts; otherwise a readable line per result.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "api/half.h"
#include "api/json_codec.h"
#include "api/mesh.h"
#include "api/shape.h"
#include "storage/env.h"
#include "storage/index.h"
#include "storage/local_checkpoint.h"
#include "storage/read_planner.h"
#include "storage/shard_writer.h"
#include "storage/synthetic.h"
#include "storage/thread_pool.h"
#include "bench/stats.h"

namespace tessera::bench {
namespace {

using tessera::bench::Round;
using tessera::bench::Median;

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using storage::Env;
using storage::JoinPath;
using storage::ThreadPool;
// Keys in insertion order, so that every line starts with "bench" and "op" like the peers'.
using Line = nlohmann::ordered_json;

// The state dict of bench/peers/save_torch.py: tensor i is (912·k, 1024), k = i % 8 + 1.
constexpr int kTensors = 64;
constexpr int64_t kRowUnit = 912;
constexpr int64_t kCols = 1024;
// The index merge of a large job: 256 writers, each recording 1000 small tensors.
constexpr int kMergeFragments = 256;
constexpr int kMergeTensorsPerFragment = 1000;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Bytes that are written once at allocation, so the first-touch page faults
// (1–4 GB/s on this VM, see bench/peers/README.md) are paid here and never inside a
// timed region: they are the allocator's cost, not the storage engine's.
class Buffer {
 public:
  explicit Buffer(size_t n) : data_(new char[std::max<size_t>(n, 1)]), size_(n) {
    std::memset(data_.get(), 0, size_);
  }
  char* data() { return data_.get(); }
  const char* data() const { return data_.get(); }
  size_t size() const { return size_; }

 private:
  std::unique_ptr<char[]> data_;
  size_t size_;
};

// One data kind: its tensors, laid out back to back in one buffer.
struct State {
  std::string kind;  // the dtype name, also the "dtype" field of the JSON lines
  DType dtype = DType::kFloat32;
  std::vector<storage::TensorMeta> tensors;
  std::vector<size_t> offsets;  // of each tensor in `data`
  uint64_t bytes = 0;
  std::unique_ptr<Buffer> data;

  const char* tensor_data(size_t t) const { return data->data() + offsets[t]; }
};

State MakeLayout(DType dtype, double scale) {
  State s;
  s.dtype = dtype;
  s.kind = std::string(DTypeName(dtype));
  for (int i = 0; i < kTensors; ++i) {
    const int64_t rows =
        std::max<int64_t>(1, std::llround(static_cast<double>(kRowUnit * (i % 8 + 1)) * scale));
    storage::TensorMeta meta{"layer" + std::to_string(i) + ".weight", dtype, {rows, kCols},
                             Layout::Replicated(2)};
    s.offsets.push_back(s.bytes);
    s.bytes += meta.logical_bytes();
    s.tensors.push_back(std::move(meta));
  }
  s.data = std::make_unique<Buffer>(s.bytes);
  return s;
}

// float32 ~ N(0, 0.02), one seed per tensor; split over the cores because a
// GiB of Box-Muller normals takes seconds on one.
State MakeFloat32State(double scale) {
  State s = MakeLayout(DType::kFloat32, scale);
  const int workers = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&s, w, workers] {
      for (size_t t = w; t < s.tensors.size(); t += workers) {
        storage::FillSynthetic(DType::kFloat32, NumElements(s.tensors[t].shape), t + 1,
                               s.data->data() + s.offsets[t]);
      }
    });
  }
  for (auto& t : threads) t.join();
  return s;
}

// The same values truncated to bfloat16 (as zstd_speed.sh's "bf16 truncation").
State MakeBfloat16State(const State& f32, double scale) {
  State s = MakeLayout(DType::kBFloat16, scale);
  const auto* src = reinterpret_cast<const float*>(f32.data->data());
  auto* dst = reinterpret_cast<uint16_t*>(s.data->data());
  const size_t n = f32.bytes / sizeof(float);
  for (size_t i = 0; i < n; ++i) dst[i] = FloatToBFloat16(src[i]);
  return s;
}

// Drops every file under `root` from the page cache, as save_torch.py does for
// its cold loads. fdatasync first: DONTNEED skips dirty pages. The host may
// still cache the virtual disk (bench/peers/README.md), so "cold" is cold for the guest only.
Status DropPageCache(const std::string& root) {
  std::error_code ec;
  for (fs::recursive_directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    const std::string path = it->path().string();
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, "open", path);
    int err = 0;
    if (::fdatasync(fd) != 0) err = errno;
    if (err == 0) err = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
    if (err != 0) return ErrnoStatus(err, "fdatasync/posix_fadvise", path);
  }
  if (ec) return ErrnoStatus(ec.value(), "walk", root);
  return Status::Ok();
}

struct SaveRun {
  std::string dir;
  double seconds = 0;
  double data_seconds = 0;  // until the last chunk was handed to write(2)
  uint64_t stored_bytes = 0;
};

// One SaveCheckpoint into a fresh `root`, timed as a whole.
Result<SaveRun> TimedSave(Env* env, const State& state, bool compress, ThreadPool* pool,
                          const std::string& root) {
  storage::SaveRequest req;
  req.root = root;
  req.mesh = Mesh{"bench", {{"d", 1}}, 1};
  req.step = 1;
  req.tensors = state.tensors;
  req.source = [&state](size_t t, int64_t) -> const void* { return state.tensor_data(t); };
  req.options.compress = compress;
  req.options.level = 1;
  req.options.pool = pool;
  // The progress callback runs on the writing thread after each chunk's write(2):
  // its last call splits the save into "data into the page cache" and
  // "fsync + fragment + merge + commit", without touching storage code.
  Clock::time_point last_chunk;
  req.options.on_progress = [&last_chunk](uint64_t) { last_chunk = Clock::now(); };
  const auto t0 = Clock::now();
  auto summary = storage::SaveCheckpoint(env, req);
  const double seconds = SecondsSince(t0);
  if (!summary.ok()) return summary.status().WithContext("save");
  if (summary->logical_bytes != state.bytes || summary->written_raw_bytes != state.bytes) {
    return Internal("save reported " + std::to_string(summary->logical_bytes) + " logical / " +
                    std::to_string(summary->written_raw_bytes) + " written bytes, expected " +
                    std::to_string(state.bytes));
  }
  SaveRun run;
  run.dir = summary->dir;
  run.seconds = seconds;
  run.data_seconds = std::chrono::duration<double>(last_chunk - t0).count();
  run.stored_bytes = summary->stored_bytes;
  return run;
}

// How many chunks the writer stored compressed (zstd, or the float codec's planes) and
// raw: it may store a slice raw when a sample shows compression does not pay, so
// "zstd-1" alone does not say what was done.
Result<std::pair<int64_t, int64_t>> CountChunkCodecs(Env* env, const std::string& dir) {
  ASSIGN_OR_RETURN(auto index, storage::CheckpointIndex::Open(env, dir));
  int64_t zstd = 0, raw = 0;
  for (const auto& t : index.tensors()) {
    for (const auto& s : t.slices) {
      for (const auto& c : s.chunks) (c.loc.codec != storage::Codec::kRaw ? zstd : raw) += 1;
    }
  }
  return std::make_pair(zstd, raw);
}

struct ReadRun {
  double seconds = 0;
  double open_seconds = 0;  // CheckpointIndex::Open, part of `seconds`
  uint64_t stored_bytes = 0;
};

// Reads every tensor of `dir` whole into `out`, timed from opening the index to
// the last byte, then checks `out` against the saved bytes (untimed).
Result<ReadRun> TimedRead(Env* env, const std::string& dir, const State& state, Buffer* out,
                          ThreadPool* pool) {
  // A read that skipped a chunk must not pass on the previous run's bytes.
  std::memset(out->data(), 0, state.bytes);
  ReadRun run;
  const auto t0 = Clock::now();
  auto index = storage::CheckpointIndex::Open(env, dir);
  if (!index.ok()) return index.status().WithContext("read");
  run.open_seconds = SecondsSince(t0);
  storage::ShardCache shards(env, dir);
  for (size_t t = 0; t < state.tensors.size(); ++t) {
    const auto& meta = state.tensors[t];
    const storage::TensorEntry* entry = index->Find(meta.name);
    if (entry == nullptr) return DataLoss("read: tensor '" + meta.name + "' is not in " + dir);
    ASSIGN_OR_RETURN(auto plan, storage::PlanRead(*entry, FullSlice(meta.shape)));
    RETURN_IF_ERROR(storage::ExecuteRead(plan, &shards, out->data() + state.offsets[t],
                                         meta.logical_bytes(), pool));
    run.stored_bytes += plan.stored_bytes;
  }
  run.seconds = SecondsSince(t0);
  // Whole tensors need every chunk exactly once; more would mean wasted reads.
  if (run.stored_bytes != index->stored_bytes()) {
    return Internal("read: the plans read " + std::to_string(run.stored_bytes) +
                    " stored bytes of the " + std::to_string(index->stored_bytes()) +
                    " the index records");
  }
  for (size_t t = 0; t < state.tensors.size(); ++t) {
    if (std::memcmp(out->data() + state.offsets[t], state.tensor_data(t),
                    state.tensors[t].logical_bytes()) != 0) {
      return DataLoss("read: tensor '" + state.tensors[t].name + "' differs from what was saved");
    }
  }
  return run;
}

// Prints results as JSON lines or as readable lines.
class Reporter {
 public:
  explicit Reporter(bool json) : json_(json) {}

  void Emit(const Line& fields) {
    Line line = {{"bench", "tessera"}};
    line.update(fields);
    if (json_) {
      std::printf("%s\n", line.dump().c_str());
    } else {
      std::string text;
      for (auto& [k, v] : line.items()) {
        if (k == "bench") continue;
        text += k + "=" + (v.is_string() ? v.get<std::string>() : v.dump()) + "  ";
      }
      std::printf("%s\n", text.c_str());
    }
    std::fflush(stdout);
  }

 private:
  bool json_;
};

// The samples of one (op, dtype, codec, threads) across runs, for the median lines.
struct Samples {
  std::vector<double> seconds;
  std::vector<double> gbps;
  uint64_t bytes = 0;
  uint64_t stored_bytes = 0;
};
using SampleKey = std::tuple<std::string, std::string, std::string, int>;

Line SaveReadFields(const std::string& op, const State& state, const std::string& codec,
                    int threads) {
  return {{"op", op}, {"dtype", state.kind}, {"codec", codec}, {"threads", threads},
          {"bytes", state.bytes}};
}

// Writes `fragments` fragments of 1000 one-chunk tensors each into `dir` with
// FragmentBuilder::WriteTo, as the writers of a large job would. Returns their names.
Result<std::vector<std::string>> BuildFragments(Env* env, const std::string& dir, int fragments) {
  RETURN_IF_ERROR(env->CreateDirs(dir));
  std::vector<std::string> names(fragments);
  std::vector<Status> errors(fragments);
  // Builders are independent in-memory databases, so the cores share them out.
  const int workers = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      for (int f = w; f < fragments; f += workers) {
        names[f] = storage::FragmentFileName(f);
        errors[f] = [&]() -> Status {
          ASSIGN_OR_RETURN(auto builder, storage::FragmentBuilder::Create());
          const std::string shard = storage::ShardFileName(f);
          for (int i = 0; i < kMergeTensorsPerFragment; ++i) {
            storage::TensorMeta meta{"r" + std::to_string(f) + ".t" + std::to_string(i),
                                     DType::kFloat32, {256}, Layout::Replicated(1)};
            const uint64_t offset = 32 + 1024 * static_cast<uint64_t>(i);
            storage::SliceChunk chunk{
                0, {offset, 1024, 1024, 0x9e3779b97f4a7c15ULL * (i + 1), storage::Codec::kRaw}, {}};
            RETURN_IF_ERROR(builder.AddSlice(meta, FullSlice(meta.shape), shard, {chunk}));
          }
          return builder.WriteTo(env, JoinPath(dir, names[f]));
        }();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& st : errors) RETURN_IF_ERROR(st);
  return names;
}

// Times MergeFragments of the fragments in `source` (copied into a fresh
// staging dir first, since the merge deletes them), then CheckpointIndex::Open.
Status BenchIndexMerge(Env* env, const std::string& source, const std::vector<std::string>& names,
                       const std::string& staging, double build_seconds, int run,
                       Reporter* out) {
  RETURN_IF_ERROR(env->CreateDirs(staging));
  for (const auto& name : names) {
    std::error_code ec;
    fs::copy_file(JoinPath(source, name), JoinPath(staging, name), ec);
    if (ec) return ErrnoStatus(ec.value(), "copy", JoinPath(source, name));
  }
  const int fragments = static_cast<int>(names.size());
  storage::CheckpointMeta meta{Mesh{"bench", {{"d", fragments}}, 1}, 1, Json::object(), 0};
  const auto t_merge = Clock::now();
  Status merged = storage::MergeFragments(env, staging, names, meta);
  const double merge_seconds = SecondsSince(t_merge);
  if (!merged.ok()) return merged.WithContext("index merge");
  ASSIGN_OR_RETURN(uint64_t index_bytes, env->FileSize(JoinPath(staging, storage::kIndexFile)));

  const auto t_open = Clock::now();
  auto index = storage::CheckpointIndex::Open(env, staging);
  const double open_seconds = SecondsSince(t_open);
  if (!index.ok()) return index.status().WithContext("index open");
  const size_t tensors = names.size() * kMergeTensorsPerFragment;
  if (index->tensors().size() != tensors) {
    return Internal("merged index holds " + std::to_string(index->tensors().size()) +
                    " tensors, expected " + std::to_string(tensors));
  }
  out->Emit({{"op", "index_merge"}, {"run", run}, {"fragments", fragments},
             {"tensors", tensors}, {"index_bytes", index_bytes},
             {"build_fragments_s", Round(build_seconds, 4)},
             {"time_s", Round(merge_seconds, 4)}, {"open_s", Round(open_seconds, 4)}});
  return env->DeleteTree(staging);
}

struct Options {
  std::string dir = ".";
  double scale = 1.0;
  int repeat = 2;
  bool json = false;
};

Status Run(const Options& opt, const std::string& tmp, Reporter* out) {
  Env* env = storage::DefaultEnv();
  State f32 = MakeFloat32State(opt.scale);
  State bf16 = MakeBfloat16State(f32, opt.scale);
  // Read destination, big enough for either kind and touched once, up front.
  Buffer read_buffer(std::max(f32.bytes, bf16.bytes));
  out->Emit({{"op", "config"},
             {"scale", opt.scale},
             {"repeat", opt.repeat},
             {"tensors", kTensors},
             {"bytes_float32", f32.bytes},
             {"bytes_bfloat16", bf16.bytes},
             {"chunk_size", storage::kDefaultChunkSize},
             {"hardware_threads", std::thread::hardware_concurrency()},
             {"dir", tmp}});

  std::map<SampleKey, Samples> samples;
  std::vector<SampleKey> order;  // first-seen order, for the median lines
  auto record = [&samples, &order](const std::string& op, const State& s, const std::string& codec,
                           int threads, double seconds, uint64_t stored) {
    const SampleKey key{op, s.kind, codec, threads};
    if (!samples.count(key)) order.push_back(key);
    Samples& x = samples[key];
    x.seconds.push_back(seconds);
    x.gbps.push_back(static_cast<double>(s.bytes) / seconds / 1e9);
    x.bytes = s.bytes;
    x.stored_bytes = stored;
  };

  const std::string root = JoinPath(tmp, "ckpt");
  // Repeats are the outer loop so that a slow spell of the noisy VM spreads over
  // every configuration instead of hitting all the runs of one.
  for (int run = 0; run < opt.repeat; ++run) {
    for (const State* state : {&f32, &bf16}) {
      for (const bool compress : {true, false}) {
        const std::string codec = compress ? "zstd-1" : "none";
        for (const int threads : {1, 2}) {
          ThreadPool pool(threads);
          ASSIGN_OR_RETURN(SaveRun save, TimedSave(env, *state, compress, &pool, root));
          record("save", *state, codec, threads, save.seconds, save.stored_bytes);
          ASSIGN_OR_RETURN(auto codecs, CountChunkCodecs(env, save.dir));
          Line line = SaveReadFields("save", *state, codec, threads);
          line.update({{"run", run},
                       {"stored_bytes", save.stored_bytes},
                       {"ratio", Round(static_cast<double>(state->bytes) / save.stored_bytes,
                                       4)},
                       {"time_s", Round(save.seconds, 6)},
                       {"data_s", Round(save.data_seconds, 6)},
                       {"sync_commit_s", Round(save.seconds - save.data_seconds, 6)},
                       {"chunks_zstd", codecs.first},
                       {"chunks_raw", codecs.second},
                       {"GBps", Round(state->bytes / save.seconds / 1e9, 4)}});
          out->Emit(line);

          for (const char* mode : {"cold", "warm"}) {
            if (std::strcmp(mode, "cold") == 0) RETURN_IF_ERROR(DropPageCache(root));
            ASSIGN_OR_RETURN(ReadRun read, TimedRead(env, save.dir, *state, &read_buffer, &pool));
            const std::string op = std::string("read_") + mode;
            record(op, *state, codec, threads, read.seconds, read.stored_bytes);
            Line r = SaveReadFields(op, *state, codec, threads);
            r.update({{"run", run},
                      {"stored_bytes", read.stored_bytes},
                      {"verified", true},
                      {"time_s", Round(read.seconds, 6)},
                      {"open_s", Round(read.open_seconds, 6)},
                      {"GBps", Round(state->bytes / read.seconds / 1e9, 4)}});
            out->Emit(r);
          }
          RETURN_IF_ERROR(env->DeleteTree(root));
        }
      }
    }
  }
  for (const auto& key : order) {
    const Samples& x = samples.at(key);
    const auto& [op, dtype, codec, threads] = key;
    Line line = {{"op", op},     {"dtype", dtype},       {"codec", codec},
                 {"threads", threads}, {"bytes", x.bytes}, {"stat", "median"},
                 {"runs", x.seconds.size()},
                 {"time_s", Round(Median(x.seconds), 6)},
                 {"GBps", Round(Median(x.gbps), 4)}};
    if (op == "save") {
      line["stored_bytes"] = x.stored_bytes;
      line["ratio"] = Round(static_cast<double>(x.bytes) / x.stored_bytes, 4);
    }
    out->Emit(line);
  }

  const int fragments =
      opt.scale >= 1 ? kMergeFragments
                     : std::max(4, static_cast<int>(std::lround(kMergeFragments * opt.scale)));
  // Building 256 000 tensors' fragments takes seconds and is not what is
  // measured, so it happens once; every run merges a fresh copy.
  const std::string source = JoinPath(tmp, "fragments");
  const auto t_build = Clock::now();
  ASSIGN_OR_RETURN(auto names, BuildFragments(env, source, fragments));
  const double build_seconds = SecondsSince(t_build);
  for (int run = 0; run < opt.repeat; ++run) {
    RETURN_IF_ERROR(BenchIndexMerge(env, source, names, JoinPath(tmp, "merge"), build_seconds,
                                    run, out));
  }
  return Status::Ok();
}

}  // namespace
}  // namespace tessera::bench

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  tessera::bench::Options opt;
  CLI::App app{"tessera_bench_storage: save/read throughput and index merge time"};
  app.add_option("--dir", opt.dir, "Where to write (a temp subdir is created and removed)");
  app.add_option("--scale", opt.scale, "Fraction of the 1 GiB state (tests run it tiny)")
      ->check(CLI::Range(1e-6, 64.0));
  app.add_option("--repeat", opt.repeat, "Runs of every measure")->check(CLI::Range(1, 100));
  app.add_flag("--json", opt.json, "One JSON object per line on stdout");
  CLI11_PARSE(app, argc, argv);

  std::error_code ec;
  fs::create_directories(opt.dir, ec);
  if (ec) {
    std::fprintf(stderr, "cannot create --dir %s: %s\n", opt.dir.c_str(), ec.message().c_str());
    return 1;
  }
  std::string tmpl = tessera::storage::JoinPath(opt.dir, "tessera-bench-XXXXXX");
  if (::mkdtemp(tmpl.data()) == nullptr) {
    std::perror(("mkdtemp " + tmpl).c_str());
    return 1;
  }
  tessera::bench::Reporter reporter(opt.json);
  tessera::Status st = tessera::bench::Run(opt, tmpl, &reporter);
  fs::remove_all(tmpl, ec);
  if (!st.ok()) {
    std::fprintf(stderr, "tessera_bench_storage: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
