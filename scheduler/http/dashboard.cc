#include "scheduler/http/dashboard.h"

#include <string>
#include <utility>
#include <vector>

#include "scheduler/http/web_assets.h"

namespace taskgrid::http {

namespace {

// Scripts, styles and requests only from this origin (no inline script, so
// an injected tag cannot run), no framing (clickjacking of the action
// buttons), no referrer with ids in it.
const std::vector<std::pair<std::string, std::string>>& PageHeaders() {
  static const auto* const headers = new std::vector<std::pair<std::string, std::string>>{
      {"Content-Security-Policy",
       "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"},
      {"X-Frame-Options", "DENY"},
      {"X-Content-Type-Options", "nosniff"},
      {"Referrer-Policy", "no-referrer"},
      // Small, and must change with the binary: ask every time.
      {"Cache-Control", "no-cache"},
  };
  return *headers;
}

}  // namespace

void AddDashboard(HttpServer* server) {
  for (const WebAsset& asset : WebAssets()) {
    Handler serve = [&asset](const Request&) {
      return Response{200, std::string(asset.content_type), std::string(asset.body), PageHeaders()};
    };
    if (asset.name == "index.html") server->Get("/", serve);
    server->Get("/" + std::string(asset.name), std::move(serve));
  }
}

}  // namespace taskgrid::http
