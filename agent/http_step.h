// The mechanism under TaskRun's http steps: one HTTP request made with
// libcurl inside the agent (no process), its response body kept in the
// step's stdout tail, and the status judged against the step's success
// codes. Internal to the executor.
//
// Thread contract: RunHttp() blocks its calling thread; several may run at
// once on different threads (libcurl's global set-up is done once, the
// first time any of them asks). OutputTail is not thread-safe.
//
// The request: the step's method (POST when empty), URL and headers; no
// redirect is followed (a 3xx is an answer like any other); http_proxy,
// https_proxy and no_proxy of the agent's environment apply; TLS peers are
// verified against the system's CA certificates. The body (HttpBody) is
// sent with every method but GET and HEAD, which send none.
#pragma once

#include <string>

#include "agent/process.h"
#include "taskgrid/v1/agent_service.pb.h"
#include "taskgrid/v1/task.pb.h"

namespace taskgrid::agent::internal {

// The body of an http step of `assignment`: the step's `body` when set;
// else, for a task delivered with merged payloads, a JSON array of them in
// order, each embedded as is when it is one JSON value and as a JSON
// string otherwise; else the assignment's payload.
struct HttpBody {
  std::string data;
  // The JSON array of merged payloads: sent as application/json unless the
  // step names a content-type of its own.
  bool json = false;
};
HttpBody MakeHttpBody(const v1::HttpStep& step, const v1::Assignment& assignment);

// How an http step ended. When stopped_by is not kNone (cancelled, or a
// deadline passed) the request was abandoned and the rest is meaningless.
struct HttpEnd {
  StopReason stopped_by = StopReason::kNone;
  taskgrid::v1::Outcome outcome = taskgrid::v1::OUTCOME_SUCCEEDED;
  // The response's status; -1 when none came (connection refused, DNS, TLS,
  // a malformed step).
  int exit_code = -1;
  // Empty on success; else readable, e.g. "HTTP 503 from POST
  // http://127.0.0.1:1234/hook" or libcurl's account of what went wrong.
  std::string error;
  // Another attempt cannot help: a status that is neither a success nor
  // 5xx nor 429, or a step that cannot be sent at all.
  bool permanent = false;
};

// Sends `step` with `body`, appending the response body to `out`, until an
// answer, an error, or `ctl` stops it (within a few milliseconds of a
// Cancel() that writes ctl.wake_fd). `index` names the step in messages.
HttpEnd RunHttp(const v1::HttpStep& step, int index, const HttpBody& body, const StopControl& ctl,
                OutputTail* out);

}  // namespace taskgrid::agent::internal
