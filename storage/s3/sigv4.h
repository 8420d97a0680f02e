// AWS Signature Version 4 for S3 requests (header-based auth), with OpenSSL's
// SHA-256 and HMAC. Debian has no maintained C++ S3 SDK and libs3 signs only
// SigV2, so the signer is ours; it is checked against AWS's published examples.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera::storage::s3 {

struct Credentials {
  std::string access_key;
  std::string secret_key;
  std::string session_token;  // sent as x-amz-security-token when set
};

// What is signed. Paths and query parameters are given unencoded: the signer
// encodes them once, as S3 wants (RFC 3986 unreserved characters stay, '/'
// stays in the path). Send the request with EncodePath(path) and
// CanonicalQuery(query), so that what is sent is what was signed.
struct SignRequest {
  std::string method;  // GET, PUT, POST, DELETE, HEAD
  std::string path;    // "/bucket/key" or "/key" (virtual-host style)
  std::vector<std::pair<std::string, std::string>> query;    // any order; "" values allowed
  std::vector<std::pair<std::string, std::string>> headers;  // must include host and x-amz-date
  std::string payload_sha256;  // hex SHA-256 of the body, or "UNSIGNED-PAYLOAD"
  std::string amz_date;        // YYYYMMDDTHHMMSSZ, as in the x-amz-date header
  std::string region = "us-east-1";
  std::string service = "s3";
};

struct Signature {
  std::string canonical_request;
  std::string string_to_sign;
  std::string signed_headers;  // "host;x-amz-date"
  std::string signature;       // hex
  std::string authorization;   // the Authorization header's value
};

Signature Sign(const SignRequest& request, const Credentials& credentials);

// Percent-encodes everything but A-Z a-z 0-9 - _ . ~ (and '/' unless encode_slash).
std::string UriEncode(std::string_view s, bool encode_slash);
std::string EncodePath(std::string_view path);
// "a=1&b=" with keys and values encoded and sorted, as signed.
std::string CanonicalQuery(std::vector<std::pair<std::string, std::string>> query);

std::string Sha256Hex(std::string_view data);
// The hex SHA-256 of the empty string: the payload hash of bodiless requests.
inline constexpr std::string_view kEmptySha256 =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
// YYYYMMDDTHHMMSSZ in UTC.
std::string AmzDate(std::chrono::system_clock::time_point t);

}  // namespace tessera::storage::s3
