// The fault loop over a mesh's changes of state: registration, a retention change and
// deletion, each with its Nth I/O failing (root and catalog both write through one
// FaultEnv), for N = 1, 2, ... until it goes through. After every failure the three
// stores agree: memory (what REST answers), the catalog (read through a connection of its
// own) and the root (the mesh's document), on whether the mesh exists and on its policy.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <memory>

#include "service/catalog.h"
#include "service/service.h"
#include "storage/root_meta.h"
#include "storage/testing/fault_env.h"
#include "storage/testing/mem_env.h"
#include "temp_dir.h"

namespace tessera::service {
namespace {

constexpr int kRanks = 2;

// A mesh as one store holds it: absent, or present with its retention's keep_last.
struct Seen {
  bool present = false;
  int64_t keep_last = 0;
  bool operator==(const Seen& o) const {
    return present == o.present && (!present || keep_last == o.keep_last);
  }
};

// keep_last of a retention document (null or absent: 0).
int64_t KeepLast(const Json& policy) {
  return policy.is_object() ? RetentionPolicy::FromJson(policy).keep_last : 0;
}

std::ostream& operator<<(std::ostream& os, const Seen& s) {
  return os << (s.present ? "present, keep_last " + std::to_string(s.keep_last) : "absent");
}

class MeshFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    opts_.data_dir = tmp_.path() + "/data";  // SQLite in place, its changes past the FaultEnv
    ASSERT_EQ(::mkdir(opts_.data_dir.c_str(), 0700), 0);
    opts_.checkpoint_root = "/root";
    ASSERT_TRUE(mem_.CreateDirs(opts_.data_dir).ok());
    auto s = Service::Create(opts_, &env_);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    service_ = std::move(*s);
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_TRUE(service_->RegisterWorker({{"name", std::to_string(r)}, {"local_port", 1}}).ok());
    }
  }
  void TearDown() override {
    service_.reset();
  }

  Status Register() {
    return service_->PutMesh("m", {{"axes", {{{"name", "d"}, {"size", kRanks}}}}, {"self_test", false}})
        .status();
  }
  Status SetKeepLast(int64_t n) { return service_->PutRetention("m", {{"keep_last", n}}).status(); }

  Seen InMemory() {
    auto m = service_->GetMesh("m");
    if (!m.ok()) return {};
    return {true, KeepLast((*m)["retention"])};
  }
  Seen InCatalog() {
    auto catalog = Catalog::Open(&mem_, opts_.data_dir);  // a connection of its own
    EXPECT_TRUE(catalog.ok()) << catalog.status().ToString();
    if (!catalog.ok()) return {};
    Seen seen;
    auto meshes = (*catalog)->All("meshes");
    auto policies = (*catalog)->All("retention");
    EXPECT_TRUE(meshes.ok() && policies.ok());
    if (!meshes.ok() || !policies.ok()) return {};
    for (const Json& m : *meshes) {
      seen.present = seen.present || m.value("name", "") == "m";
    }
    for (const Json& r : *policies) {
      if (r.value("mesh", "") == "m") seen.keep_last = KeepLast(r);
    }
    return seen;
  }
  Seen InRoot() {
    auto doc = storage::ReadMeshDoc(&mem_, opts_.checkpoint_root, "m");
    EXPECT_TRUE(doc.ok()) << doc.status().ToString();
    if (!doc.ok() || !doc->has_value() || (*doc)->deleted()) return {};
    const Json& d = (*doc)->doc;
    return {true, KeepLast(d.value("retention", Json()))};
  }
  // The three stores agree; returns what they hold.
  Seen ExpectAgree(const std::string& when) {
    const Seen memory = InMemory(), catalog = InCatalog(), root = InRoot();
    EXPECT_EQ(memory, catalog) << when << ": memory and catalog disagree";
    EXPECT_EQ(memory, root) << when << ": memory and root disagree";
    return memory;
  }

  // Runs `op` with its Nth I/O failing, N = 1, 2, ..., undoing a failure's effect with
  // `reset` (no faults) before the next try; the number of failed tries.
  int Loop(const std::string& name, const std::function<Status()>& op, const Seen& before,
           const Seen& after, const std::function<void()>& reset) {
    int failed = 0;
    for (uint64_t n = 1; n < 500; ++n) {
      env_.FailAt(n);
      Status st = op();
      const bool fired = env_.fired();
      env_.Reset();
      const std::string when = name + " with I/O " + std::to_string(n) + " failing";
      const Seen seen = ExpectAgree(when);
      if (st.ok()) {
        EXPECT_EQ(seen, after) << when;
        if (!fired) return failed;
      } else {
        ++failed;
        EXPECT_TRUE(fired) << when << ": " << st.ToString();
        EXPECT_EQ(seen, before) << when << ": a failed change took effect: " << st.ToString();
        EXPECT_NE(st.message().find("mesh m"), std::string::npos) << st.ToString();
      }
      reset();
      if (HasFatalFailure()) return failed;
    }
    ADD_FAILURE() << name << " never went through";
    return failed;
  }

  testing::TempDir tmp_{"tessera_mesh_faults"};  // goes last
  ServiceOptions opts_;
  storage::MemEnv mem_;
  storage::FaultEnv env_{&mem_};
  std::unique_ptr<Service> service_;
};

TEST_F(MeshFaults, MemoryCatalogAndRootAgreeAfterEveryFailure) {
  const Seen absent{}, registered{true, 0}, kept{true, 3};
  int failed = Loop("registration", [&] { return Register(); }, absent, registered, [&] {
    if (InMemory().present) {
      ASSERT_TRUE(service_->DeleteMesh("m").ok());
    }
  });
  EXPECT_GT(failed, 2) << "registration's writes did not go through the Env";
  ASSERT_EQ(ExpectAgree("registered"), registered);

  failed = Loop("retention change", [&] { return SetKeepLast(3); }, registered, kept,
                [&] { ASSERT_TRUE(SetKeepLast(0).ok()); });
  EXPECT_GT(failed, 2) << "the retention change's writes did not go through the Env";

  failed = Loop("deletion", [&] { return service_->DeleteMesh("m"); }, kept, absent, [&] {
    if (!InMemory().present) {
      ASSERT_TRUE(Register().ok());
      ASSERT_TRUE(SetKeepLast(3).ok());
    }
  });
  EXPECT_GT(failed, 2) << "deletion's writes did not go through the Env";

  // A mesh registered again under the name starts clean: no policy of the one deleted.
  ASSERT_TRUE(Register().ok());
  EXPECT_EQ(ExpectAgree("registered again"), registered);
}

}  // namespace
}  // namespace tessera::service
