#include "storage/s3/sigv4.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

#include <algorithm>
#include <cctype>
#include <ctime>

namespace tessera::storage::s3 {
namespace {

std::string Hex(const unsigned char* p, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[p[i] >> 4];
    out[2 * i + 1] = kDigits[p[i] & 15];
  }
  return out;
}

std::string Hmac(std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &n);
  return std::string(reinterpret_cast<const char*>(out), n);
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// Header values are signed trimmed, with runs of spaces collapsed to one.
std::string TrimValue(std::string_view v) {
  std::string out;
  bool space = false;
  for (char c : v) {
    if (c == ' ' || c == '\t') {
      space = !out.empty();
      continue;
    }
    if (space) out.push_back(' ');
    space = false;
    out.push_back(c);
  }
  return out;
}

}  // namespace

std::string UriEncode(std::string_view s, bool encode_slash) {
  static constexpr char kDigits[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (c == '/' && !encode_slash)) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kDigits[c >> 4]);
      out.push_back(kDigits[c & 15]);
    }
  }
  return out;
}

std::string EncodePath(std::string_view path) {
  return path.empty() ? "/" : UriEncode(path, /*encode_slash=*/false);
}

std::string CanonicalQuery(std::vector<std::pair<std::string, std::string>> query) {
  for (auto& [k, v] : query) {
    k = UriEncode(k, true);
    v = UriEncode(v, true);
  }
  std::sort(query.begin(), query.end());
  std::string out;
  for (const auto& [k, v] : query) {
    if (!out.empty()) out.push_back('&');
    out += k + "=" + v;
  }
  return out;
}

std::string Sha256Hex(std::string_view data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  return Hex(digest, sizeof digest);
}

std::string AmzDate(std::chrono::system_clock::time_point t) {
  const std::time_t secs = std::chrono::system_clock::to_time_t(t);
  std::tm utc{};
  gmtime_r(&secs, &utc);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &utc);
  return buf;
}

Signature Sign(const SignRequest& r, const Credentials& credentials) {
  // Canonical headers: lower-case names, sorted; repeated names joined by ','.
  std::vector<std::pair<std::string, std::string>> headers;
  for (const auto& [name, value] : r.headers) headers.emplace_back(Lower(name), TrimValue(value));
  std::stable_sort(headers.begin(), headers.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string canonical_headers, signed_headers;
  for (size_t i = 0; i < headers.size(); ++i) {
    if (i > 0 && headers[i].first == headers[i - 1].first) {
      canonical_headers.back() = ',';  // replaces the previous line's '\n'
      canonical_headers += headers[i].second + "\n";
      continue;
    }
    if (!signed_headers.empty()) signed_headers.push_back(';');
    signed_headers += headers[i].first;
    canonical_headers += headers[i].first + ":" + headers[i].second + "\n";
  }

  Signature s;
  s.signed_headers = signed_headers;
  s.canonical_request = r.method + "\n" + EncodePath(r.path) + "\n" + CanonicalQuery(r.query) +
                        "\n" + canonical_headers + "\n" + signed_headers + "\n" +
                        r.payload_sha256;
  const std::string day = r.amz_date.substr(0, 8);
  const std::string scope = day + "/" + r.region + "/" + r.service + "/aws4_request";
  s.string_to_sign = "AWS4-HMAC-SHA256\n" + r.amz_date + "\n" + scope + "\n" +
                     Sha256Hex(s.canonical_request);
  std::string key = Hmac("AWS4" + credentials.secret_key, day);
  key = Hmac(key, r.region);
  key = Hmac(key, r.service);
  key = Hmac(key, "aws4_request");
  const std::string mac = Hmac(key, s.string_to_sign);
  s.signature = Hex(reinterpret_cast<const unsigned char*>(mac.data()), mac.size());
  s.authorization = "AWS4-HMAC-SHA256 Credential=" + credentials.access_key + "/" + scope +
                    ",SignedHeaders=" + signed_headers + ",Signature=" + s.signature;
  return s;
}

}  // namespace tessera::storage::s3
