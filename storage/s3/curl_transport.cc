// The default Transport: libcurl's easy interface, one handle per thread.
#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <mutex>

#include "storage/s3/transport.h"

namespace tessera::storage::s3 {
namespace {

size_t OnBody(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
}

size_t OnHeader(char* data, size_t size, size_t n, void* user) {
  std::string_view line(data, size * n);
  const size_t colon = line.find(':');
  if (colon != std::string_view::npos) {
    std::string name(line.substr(0, colon));
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t'))
      value.remove_prefix(1);
    while (!value.empty() &&
           (value.back() == '\r' || value.back() == '\n' || value.back() == ' ')) {
      value.remove_suffix(1);
    }
    (*static_cast<std::map<std::string, std::string>*>(user))[name] = std::string(value);
  }
  return size * n;
}

// One easy handle per thread: libcurl keeps its connection to the endpoint alive.
CURL* ThreadHandle() {
  static std::once_flag global;
  std::call_once(global, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  struct Handle {
    CURL* curl = curl_easy_init();
    ~Handle() { curl_easy_cleanup(curl); }
  };
  thread_local Handle handle;
  return handle.curl;
}

class CurlTransport final : public Transport {
 public:
  Result<HttpResponse> Send(const HttpRequest& r) override {
    curl_slist* headers = nullptr;
    for (const auto& [name, value] : r.headers) {
      headers = curl_slist_append(headers, (name + ": " + value).c_str());
    }
    headers = curl_slist_append(headers, "Expect:");  // no 100-continue round trip
    CURL* curl = ThreadHandle();
    curl_easy_reset(curl);
    HttpResponse response;
    curl_easy_setopt(curl, CURLOPT_URL, r.url.c_str());
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(r.connect_timeout_ms));
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(r.timeout_ms));
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME,
                     std::max(1L, static_cast<long>(r.stall_timeout_ms / 1000)));
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, OnBody);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &response.body);
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, OnHeader);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, &response.headers);
    if (r.method == "GET") {
      curl_easy_setopt(curl, CURLOPT_HTTPGET, 1L);
    } else if (r.method == "HEAD") {
      curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
    } else {
      curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, r.method.c_str());
      if (r.method != "DELETE" || !r.body.empty()) {
        curl_easy_setopt(curl, CURLOPT_POSTFIELDS, r.body.data());
        curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(r.body.size()));
      }
    }
    const CURLcode rc = curl_easy_perform(curl);
    curl_slist_free_all(headers);
    if (rc != CURLE_OK) return Unavailable(curl_easy_strerror(rc));
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &response.status);
    return response;
  }
};

std::mutex default_mu;
std::shared_ptr<Transport>& DefaultSetting() {
  static std::shared_ptr<Transport> transport;
  return transport;
}

}  // namespace

std::shared_ptr<Transport> NewCurlTransport() { return std::make_shared<CurlTransport>(); }

void SetDefaultTransport(std::shared_ptr<Transport> transport) {
  std::lock_guard<std::mutex> lock(default_mu);
  DefaultSetting() = std::move(transport);
}

std::shared_ptr<Transport> DefaultTransport() {
  std::lock_guard<std::mutex> lock(default_mu);
  if (!DefaultSetting()) DefaultSetting() = NewCurlTransport();
  return DefaultSetting();
}

}  // namespace tessera::storage::s3
