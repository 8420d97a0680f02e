// The S3 client's transport seam, without a network: what the client hands its
// transport (a signed request for the URL it signed), how it names a transport that
// gets no answer, and FaultTransport failing exactly the requests that match.
#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "storage/s3/client.h"
#include "storage/s3/transport.h"
#include "storage/testing/fault_transport.h"

namespace tessera::storage {
namespace {

// Answers every request 200 (an ETag for parts) and keeps what it was sent.
class RecordingTransport final : public s3::Transport {
 public:
  Result<s3::HttpResponse> Send(const s3::HttpRequest& request) override {
    std::lock_guard<std::mutex> lock(mu_);
    sent_.push_back(request.method + " " + request.url);
    headers_ = request.headers;
    if (!answer_.ok()) return answer_;
    s3::HttpResponse r;
    r.status = 200;
    r.headers["etag"] = "\"e" + std::to_string(sent_.size()) + "\"";
    return r;
  }
  std::vector<std::string> sent() {
    std::lock_guard<std::mutex> lock(mu_);
    return sent_;
  }
  std::string Header(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [n, v] : headers_) {
      if (n == name) return v;
    }
    return "";
  }
  void FailWith(Status st) { answer_ = std::move(st); }

 private:
  std::mutex mu_;
  std::vector<std::string> sent_;
  std::vector<std::pair<std::string, std::string>> headers_;
  Status answer_;
};

s3::Config TestConfig() {
  s3::Config c;
  c.endpoint = "http://s3.test:7480";
  c.bucket = "bucket";
  c.credentials = {"AK", "SECRET", "TOKEN"};
  c.retry_budget_ms = 0;  // no retries: each test's requests are exactly what it sends
  return c;
}

TEST(S3Transport, TheClientHandsOverTheSignedRequest) {
  auto recording = std::make_shared<RecordingTransport>();
  s3::Client client(TestConfig(), recording);
  ASSERT_TRUE(client.Put("m/a b$.tsr", "data", /*if_absent=*/true).ok());
  EXPECT_EQ(recording->sent(),
            std::vector<std::string>{"PUT http://s3.test:7480/bucket/m/a%20b%24.tsr"});
  EXPECT_EQ(recording->Header("If-None-Match"), "*");
  EXPECT_EQ(recording->Header("x-amz-content-sha256"), s3::Sha256Hex("data"));
  EXPECT_EQ(recording->Header("x-amz-security-token"), "TOKEN");
  const std::string auth = recording->Header("Authorization");
  EXPECT_EQ(auth.rfind("AWS4-HMAC-SHA256 Credential=AK/", 0), 0u) << auth;
  EXPECT_NE(auth.find("SignedHeaders=host;if-none-match;x-amz-content-sha256;x-amz-date;"
                      "x-amz-security-token,"),
            std::string::npos)
      << auth;
}

TEST(S3Transport, NoAnswerIsUnavailableNamingEndpointBucketAndKey) {
  auto recording = std::make_shared<RecordingTransport>();
  recording->FailWith(Unavailable("Couldn't connect to server"));
  s3::Client client(TestConfig(), recording);
  Status st = client.Put("m/step-1.commit", "x");
  EXPECT_EQ(st.code(), Code::kUnavailable);
  EXPECT_NE(st.message().find("http://s3.test:7480 (bucket bucket): PUT m/step-1.commit: "
                              "Couldn't connect to server"),
            std::string::npos)
      << st.ToString();
  EXPECT_EQ(st.details().value("endpoint", ""), "http://s3.test:7480");
}

TEST(S3Transport, FaultTransportFailsOnlyWhatMatches) {
  auto recording = std::make_shared<RecordingTransport>();
  auto faults = std::make_shared<FaultTransport>(recording, "partNumber=2&");
  s3::Client client(TestConfig(), faults);
  auto one = client.PutPart("m/shard", "u1", 1, "a");
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  auto two = client.PutPart("m/shard", "u1", 2, "b");
  ASSERT_FALSE(two.ok());
  EXPECT_EQ(two.status().code(), Code::kUnavailable);
  EXPECT_EQ(two.status().details().value("s3_code", ""), "SlowDown");
  EXPECT_EQ(two.status().details().value("key", ""), "m/shard");
  EXPECT_NE(two.status().message().find("injected fault"), std::string::npos);
  ASSERT_TRUE(client.PutPart("m/shard", "u1", 3, "c").ok());
  // The failed part never reached the store.
  EXPECT_EQ(recording->sent(),
            (std::vector<std::string>{
                "PUT http://s3.test:7480/bucket/m/shard?partNumber=1&uploadId=u1",
                "PUT http://s3.test:7480/bucket/m/shard?partNumber=3&uploadId=u1"}));
  EXPECT_EQ(faults->failed(), 1u);
}

TEST(S3Transport, TheDefaultIsTheProgramsToSet) {
  auto recording = std::make_shared<RecordingTransport>();
  const auto curl = s3::DefaultTransport();
  s3::SetDefaultTransport(recording);
  EXPECT_TRUE(s3::Client(TestConfig()).Delete("k").ok());
  s3::SetDefaultTransport(curl);
  EXPECT_EQ(recording->sent(), std::vector<std::string>{"DELETE http://s3.test:7480/bucket/k"});
}

}  // namespace
}  // namespace tessera::storage
