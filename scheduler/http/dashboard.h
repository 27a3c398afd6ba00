// The dashboard's pages: index.html at "/" and each embedded file
// (web_assets.h) at "/<name>", with headers that keep them from being
// framed by another site or reading anything but this origin. The data
// comes from the JSON API (api.h), which checks every request; the files
// themselves hold nothing secret and are served to anyone.
#pragma once

#include "scheduler/http/http_server.h"

namespace taskgrid::http {

// Registers the files on `server`. Call before server->Start.
void AddDashboard(HttpServer* server);

}  // namespace taskgrid::http
