// The S3 client against a real Ceph RADOS Gateway, started for this test binary
// by tools/s3/rgw.sh (label s3; needs root and Debian's ceph packages).
#include "storage/s3/client.h"

#include "tests/s3/rgw_fixture.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>

namespace tessera::storage::s3 {
namespace {

class S3Client : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!Rgw::error().empty()) GTEST_FAIL() << Rgw::error();
    ASSERT_TRUE(client_.CreateBucket().ok());
  }
  Client client_{Rgw::ConfigFor("tessera-client-test")};
};

TEST_F(S3Client, PutGetRangeSizeListDelete) {
  const std::string key = "m/step-1/odd key $+&=.bin";
  std::string body(100000, '\0');
  for (size_t i = 0; i < body.size(); ++i) body[i] = static_cast<char>(i * 7 + i / 13);
  ASSERT_TRUE(client_.Put(key, body).ok());
  auto got = client_.Get(key);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, body);
  auto range = client_.GetRange(key, 4097, 1000);
  ASSERT_TRUE(range.ok()) << range.status().ToString();
  EXPECT_EQ(*range, body.substr(4097, 1000));
  EXPECT_EQ(*client_.Size(key), body.size());
  ASSERT_TRUE(client_.Put("m/step-1/b", "x").ok());
  ASSERT_TRUE(client_.Put("m/step-2/a", "").ok());
  auto listed = client_.List("m/step-1/");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].key, "m/step-1/b");
  EXPECT_EQ((*listed)[1].key, key);
  EXPECT_EQ((*listed)[1].size, body.size());
  for (const char* k : {"m/step-1/b", "m/step-2/a"}) ASSERT_TRUE(client_.Delete(k).ok());
  ASSERT_TRUE(client_.Delete(key).ok());
  EXPECT_TRUE(client_.Delete(key).ok()) << "deleting what is gone succeeds";
  auto gone = client_.Get(key);
  EXPECT_EQ(gone.status().code(), Code::kNotFound);
  EXPECT_EQ(gone.status().details().value("key", ""), key) << gone.status().ToString();
}

TEST_F(S3Client, ConditionalPutCommitsOnce) {
  const std::string key = "m/step-7/MANIFEST";
  (void)client_.Delete(key);
  ASSERT_TRUE(client_.Put(key, "first", /*if_absent=*/true).ok());
  Status again = client_.Put(key, "second", /*if_absent=*/true);
  EXPECT_EQ(again.code(), Code::kConflict) << again.ToString();
  EXPECT_EQ(*client_.Get(key), "first");
  ASSERT_TRUE(client_.Delete(key).ok());
}

TEST_F(S3Client, MultipartUploadAndAbort) {
  const std::string key = "m/step-3/shard-0.tsr";
  std::string a(5 << 20, 'a'), b(5 << 20, 'b'), c(1234, 'c');
  auto id = client_.StartUpload(key);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  std::vector<std::string> etags;
  for (const std::string* part : {&a, &b, &c}) {
    auto etag = client_.PutPart(key, *id, static_cast<int>(etags.size() + 1), *part);
    ASSERT_TRUE(etag.ok()) << etag.status().ToString();
    etags.push_back(*etag);
  }
  ASSERT_TRUE(client_.FinishUpload(key, *id, etags).ok());
  EXPECT_EQ(*client_.Get(key), a + b + c);
  EXPECT_EQ(*client_.GetRange(key, (5 << 20) - 2, 4), "aabb");

  // An aborted upload leaves neither an object nor an upload behind.
  const std::string other = "m/step-4/shard-0.tsr";
  auto id2 = client_.StartUpload(other);
  ASSERT_TRUE(id2.ok());
  ASSERT_TRUE(client_.PutPart(other, *id2, 1, a).ok());
  auto uploads = client_.ListUploads("m/step-4/");
  ASSERT_TRUE(uploads.ok()) << uploads.status().ToString();
  ASSERT_EQ(uploads->size(), 1u);
  EXPECT_EQ((*uploads)[0], std::make_pair(other, *id2));
  ASSERT_TRUE(client_.AbortUpload(other, *id2).ok());
  EXPECT_TRUE(client_.ListUploads("m/step-4/")->empty());
  EXPECT_TRUE(client_.List("m/step-4/")->empty());
  ASSERT_TRUE(client_.Delete(key).ok());
}

TEST_F(S3Client, FailuresNameTheEndpointAndBucket) {
  Config bad = Rgw::ConfigFor("tessera-client-test");
  bad.credentials.secret_key = "not-the-secret";
  Status denied = Client(bad).Put("k", "v");
  EXPECT_EQ(denied.code(), Code::kUnauthenticated) << denied.ToString();
  EXPECT_EQ(denied.details().value("endpoint", ""), bad.endpoint);
  EXPECT_EQ(denied.details().value("bucket", ""), "tessera-client-test");

  Status missing = Client(Rgw::ConfigFor("no-such-bucket-here")).Put("k", "v");
  EXPECT_EQ(missing.code(), Code::kNotFound) << missing.ToString();
  EXPECT_EQ(missing.details().value("s3_code", ""), "NoSuchBucket") << missing.ToString();

  Config down = Rgw::ConfigFor("tessera-client-test");
  down.endpoint = "http://127.0.0.1:1";  // nothing listens there
  down.retry_budget_ms = 300;
  Status unreachable = Client(down).Put("k", "v");
  EXPECT_EQ(unreachable.code(), Code::kUnavailable) << unreachable.ToString();
  EXPECT_EQ(unreachable.details().value("endpoint", ""), "http://127.0.0.1:1");
  EXPECT_NE(unreachable.message().find("gave up after"), std::string::npos) << unreachable.ToString();

  auto no_env = Config::FromEnvironment("bucket", "ftp://x");
  EXPECT_EQ(no_env.status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace tessera::storage::s3

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new tessera::storage::s3::Rgw);
  return RUN_ALL_TESTS();
}
