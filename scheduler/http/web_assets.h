// The dashboard's static files (scheduler/http/web/), embedded into the
// binary at build time by cmake/EmbedFiles.cmake, so an installed
// scheduler serves them with no path to configure.
#pragma once

#include <string_view>
#include <vector>

namespace taskgrid::http {

struct WebAsset {
  std::string_view name;  // the file's base name, e.g. "app.js"
  std::string_view content_type;
  std::string_view body;
};

// Every file, in the order CMake lists them; immutable.
const std::vector<WebAsset>& WebAssets();

}  // namespace taskgrid::http
