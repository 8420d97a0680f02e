#include "http/admission.h"

#include "http/bearer_token.h"
#include "http/request_head.h"

namespace tessera::http {

std::optional<Admission> Admit(const Router& router, const AdmissionPolicy& policy,
                               std::string_view head) {
  std::optional<Request> parsed = ParseRequestHead(head);
  if (!parsed) return std::nullopt;
  Admission a;
  a.request = std::move(*parsed);
  a.route = router.Match(&a.request, &a.method_mismatch);
  const bool open = policy.token.empty();
  const bool reserved_path =
      !policy.reserved_prefix.empty() && a.request.path.starts_with(policy.reserved_prefix);
  // The header's token is compared once, and only where a route or the pool asks for it.
  const bool needs_token = !open && ((a.route != nullptr && a.route->auth) || reserved_path);
  const bool bearer = needs_token && BearerMatches(a.request.Header("authorization"), policy.token);
  a.authorized = a.route != nullptr &&
                 (open || !a.route->auth || bearer ||
                  (a.route->query_token &&
                   BearerMatches("Bearer " + a.request.Query("token").value_or(""), policy.token)));
  // Only requests that carry the token: a stranger cannot take the reserved threads.
  a.reserved = reserved_path && (open || bearer);
  return a;
}

}  // namespace tessera::http
