#include "agent/http_step.h"

#include <curl/curl.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "common/http_rules.h"
#include "common/json.h"

namespace taskgrid::agent::internal {

namespace {

// Poll period when no wake_fd tells of a Cancel().
constexpr absl::Duration kFallbackPoll = absl::Milliseconds(20);

absl::Duration Now() { return RealClock::Get()->Monotonic(); }

// curl_global_init() is not thread-safe and must come before any other
// call: a function-local static runs it exactly once, whichever request
// comes first. It is never undone (the agent makes requests until it exits).
bool CurlReady() {
  static const bool ready = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
  return ready;
}

size_t KeepBody(char* data, size_t size, size_t n, void* tail) {
  static_cast<OutputTail*>(tail)->Append(data, size * n);
  return size * n;
}

bool HasHeader(const google::protobuf::Map<std::string, std::string>& headers,
               absl::string_view name) {
  return std::any_of(headers.begin(), headers.end(),
                     [name](const auto& h) { return absl::EqualsIgnoreCase(h.first, name); });
}

// What a status says about the attempt.
enum class Verdict { kSuccess, kRetry, kPermanent };

Verdict Judge(long status, const google::protobuf::RepeatedField<int32_t>& success_codes) {
  const bool success = success_codes.empty() ? status >= 200 && status <= 299
                                             : std::find(success_codes.begin(), success_codes.end(),
                                                         status) != success_codes.end();
  if (success) return Verdict::kSuccess;
  // The server's trouble or its load, not the request's: it may pass.
  if ((status >= 500 && status <= 599) || status == 429) return Verdict::kRetry;
  return Verdict::kPermanent;
}

// The handles of one request, released in the order libcurl wants.
struct Request {
  CURLM* multi = curl_multi_init();
  CURL* easy = curl_easy_init();
  curl_slist* headers = nullptr;
  bool added = false;
  char error[CURL_ERROR_SIZE] = "";

  Request() = default;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request() {
    if (added) curl_multi_remove_handle(multi, easy);
    if (easy != nullptr) curl_easy_cleanup(easy);
    if (multi != nullptr) curl_multi_cleanup(multi);
    curl_slist_free_all(headers);
  }

  // Adds one header line; false when out of memory.
  bool AddHeader(const std::string& line) {
    curl_slist* more = curl_slist_append(headers, line.c_str());
    if (more == nullptr) return false;
    headers = more;
    return true;
  }
};

HttpEnd Failed(std::string error, bool permanent = false) {
  HttpEnd end;
  end.outcome = v1::OUTCOME_FAILED;
  end.error = std::move(error);
  end.permanent = permanent;
  return end;
}

}  // namespace

HttpBody MakeHttpBody(const v1::HttpStep& step, const v1::Assignment& assignment) {
  if (step.has_body()) return HttpBody{step.body(), false};
  if (assignment.merged_payloads().empty()) return HttpBody{assignment.payload(), false};
  std::string json = "[";
  for (const std::string& p : assignment.merged_payloads()) {
    if (json.size() > 1) json += ',';
    // A payload that is JSON already stays as its sender wrote it.
    if (IsJsonValue(p)) {
      json += p;
    } else {
      json += JsonString(p);
    }
  }
  json += ']';
  return HttpBody{std::move(json), true};
}

HttpEnd RunHttp(const v1::HttpStep& step, int index, const HttpBody& body, const StopControl& ctl,
                OutputTail* out) {
  // The scheduler checked this at submit; an older one may not have, and a
  // header with a line break must never reach the wire.
  if (const std::optional<http::Problem> bad = http::CheckStep(
          step.method(), step.url(), step.headers(), absl::MakeConstSpan(step.success_codes()))) {
    return Failed(absl::StrCat("step ", index, ": http.", bad->field, " ", bad->rule),
                  /*permanent=*/true);
  }
  const std::string method(http::MethodOrDefault(step.method()));
  const std::string what = absl::StrCat(method, " ", step.url());
  if (!CurlReady()) return Failed(absl::StrCat(what, ": libcurl could not be initialised"));
  Request req;
  if (req.multi == nullptr || req.easy == nullptr) {
    return Failed(absl::StrCat(what, ": libcurl could not make a request"));
  }

  const bool sends_body = method != "GET" && method != "HEAD";
  for (const auto& [name, value] : step.headers()) {
    // "Name;" is how libcurl is told to send a header with an empty value.
    if (!req.AddHeader(value.empty() ? name + ";" : absl::StrCat(name, ": ", value))) {
      return Failed(absl::StrCat(what, ": out of memory"));
    }
  }
  // libcurl would call any body a form; what we know is in HttpBody::json.
  if (sends_body && !HasHeader(step.headers(), "content-type") &&
      !req.AddHeader(body.json ? "Content-Type: application/json" : "Content-Type:")) {
    return Failed(absl::StrCat(what, ": out of memory"));
  }
  // "Expect: 100-continue" costs a round trip (or a second with a server
  // that ignores it) before a larger body goes out.
  if (!HasHeader(step.headers(), "expect") && !req.AddHeader("Expect:")) {
    return Failed(absl::StrCat(what, ": out of memory"));
  }

  CURL* e = req.easy;
  const CURLcode common[] = {
      curl_easy_setopt(e, CURLOPT_URL, step.url().c_str()),
      curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https"),
      curl_easy_setopt(e, CURLOPT_HTTPHEADER, req.headers),
      curl_easy_setopt(e, CURLOPT_USERAGENT, "taskgrid-agent"),
      curl_easy_setopt(e, CURLOPT_ERRORBUFFER, req.error),
      curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, &KeepBody),
      curl_easy_setopt(e, CURLOPT_WRITEDATA, out),
      // No signals: the agent has many threads, and a timeout is ours.
      curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L),
      // An abandoned request does not wait for a DNS lookup still running.
      curl_easy_setopt(e, CURLOPT_QUICK_EXIT, 1L),
  };
  CURLcode set = CURLE_OK;
  for (CURLcode rc : common) set = set != CURLE_OK ? set : rc;
  if (method == "GET") {
    set = set != CURLE_OK ? set : curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
  } else if (method == "HEAD") {
    set = set != CURLE_OK ? set : curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
  } else {
    // POSTFIELDS makes it a POST with this body; CUSTOMREQUEST renames it.
    const CURLcode with_body[] = {
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.data.size())),
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, body.data.data()),
        method == "POST" ? CURLE_OK : curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method.c_str()),
    };
    for (CURLcode rc : with_body) set = set != CURLE_OK ? set : rc;
  }
  if (set != CURLE_OK) {
    return Failed(absl::StrCat(what, ": libcurl refused an option: ", curl_easy_strerror(set)));
  }

  const auto multi_failed = [&what](CURLMcode mc) {
    return Failed(absl::StrCat(what, ": ", curl_multi_strerror(mc)));
  };
  if (CURLMcode mc = curl_multi_add_handle(req.multi, e); mc != CURLM_OK) return multi_failed(mc);
  req.added = true;
  // Wakes on the sockets, libcurl's own timers, a Cancel() (wake_fd) and
  // the deadline, whichever comes first.
  const absl::Duration max_wait = ctl.wake_fd >= 0 ? absl::Hours(1) : kFallbackPoll;
  for (;;) {
    int running = 0;
    if (CURLMcode mc = curl_multi_perform(req.multi, &running); mc != CURLM_OK) {
      return multi_failed(mc);
    }
    if (running == 0) break;
    const absl::Duration now = Now();
    if (const StopReason stop = ctl.Due(now); stop != StopReason::kNone) {
      HttpEnd end;
      end.stopped_by = stop;
      return end;
    }
    const bool has_wake = ctl.wake_fd >= 0;
    curl_waitfd wake{ctl.wake_fd, CURL_WAIT_POLLIN, 0};
    if (CURLMcode mc =
            curl_multi_poll(req.multi, has_wake ? &wake : nullptr, has_wake ? 1 : 0,
                            PollTimeoutMs(std::min(ctl.deadline - now, max_wait)), nullptr);
        mc != CURLM_OK) {
      return multi_failed(mc);
    }
    if (has_wake && (wake.revents & CURL_WAIT_POLLIN) != 0) ctl.ClearWake();
  }

  CURLcode result = CURLE_OK;
  int left = 0;
  while (CURLMsg* m = curl_multi_info_read(req.multi, &left)) {
    if (m->msg == CURLMSG_DONE) result = m->data.result;
  }
  if (result != CURLE_OK) {
    // A URL libcurl cannot parse will not parse next time either.
    const bool permanent = result == CURLE_URL_MALFORMAT || result == CURLE_UNSUPPORTED_PROTOCOL;
    return Failed(
        absl::StrCat(what, ": ", req.error[0] != '\0' ? req.error : curl_easy_strerror(result)),
        permanent);
  }
  long status = 0;
  curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
  if (status <= 0) return Failed(absl::StrCat(what, ": no HTTP status in the response"));

  HttpEnd end;
  end.exit_code = static_cast<int>(status);
  const Verdict verdict = Judge(status, step.success_codes());
  if (verdict == Verdict::kSuccess) return end;
  end.outcome = v1::OUTCOME_FAILED;
  end.error = absl::StrCat("HTTP ", status, " from ", what);
  end.permanent = verdict == Verdict::kPermanent;
  return end;
}

}  // namespace taskgrid::agent::internal
