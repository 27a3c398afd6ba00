// Fuzz target: whatever request reaches the scheduler's HTTP port, the
// JSON API answers it with a status that says what happened and a body of
// the right kind, never an internal error, and the Engine's invariants
// hold (the Engine checks them after every operation in this build).
//
// The input is a request as text (the seeds in corpus/http are readable):
//
//   METHOD PATH[?QUERY]
//   Header-Name: value
//   ...
//   (an empty line)
//   body
//
// The path and the query are percent-decoded as the server's HTTP library
// decodes them; the request goes through the server's routing
// (HttpServer::Handle) to the Api, with tokens, on an Engine over a
// MemoryStore that holds a few tasks, a job and an agent. The Engine lives
// across inputs (starting one per input would cost more than the request):
// what one input changes (a task cancelled, a queue paused) the next ones
// see, until a fresh one replaces it every few thousand inputs.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/clock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "scheduler/engine/engine.h"
#include "scheduler/http/api.h"
#include "scheduler/http/http_server.h"
#include "scheduler/service/tokens.h"
#include "scheduler/store/memory_store.h"
#include "tests/fuzz/fuzz_check.h"

namespace taskgrid::fuzz {

const google::protobuf::Message* InputPrototype() { return nullptr; }

namespace {

// An agent that takes what it is sent and forgets it.
class NullChannel final : public engine::AgentChannel {
 public:
  void Send(v1::SchedulerMessage) override {}
  void Close(const absl::Status&) override {}
};

template <typename T>
T Await(const std::function<void(engine::Engine::Reply<T>)>& call) {
  std::promise<absl::StatusOr<T>> done;
  call([&](absl::StatusOr<T> r) { done.set_value(std::move(r)); });
  absl::StatusOr<T> r = done.get_future().get();
  if (!r.ok()) Die(r.status().ToString().c_str());
  return *std::move(r);
}

v1::TaskSpec Spec(const std::string& id, const std::string& queue) {
  v1::TaskSpec t;
  t.set_id(id);
  t.set_queue(queue);
  t.add_steps()->mutable_builtin()->set_name("noop");
  return t;
}

struct World {
  FakeClock clock{absl::FromUnixSeconds(1'800'000'000)};
  store::MemoryStore store;
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<service::ReloadableTokens> tokens;
  std::unique_ptr<http::Api> api;
  http::HttpServer server;

  World() {
    engine::EngineOptions opts;
    opts.tick_interval = absl::Hours(1);  // time moves only with the fake clock
    engine = std::make_unique<engine::Engine>(&store, &clock, opts);
    if (!engine->Start().ok()) Die("the engine did not start");
    const uint64_t conn = engine->AttachAgent(std::make_shared<NullChannel>());
    v1::Hello hello;
    hello.set_agent_id("a1");
    hello.set_slots(1);
    hello.set_undrain(true);
    if (!engine->AgentHello(conn, hello).ok()) Die("the agent was refused");

    v1::SubmitTasksRequest tasks;
    *tasks.add_tasks() = Spec("t1", "default");
    *tasks.add_tasks() = Spec("t2", "images");
    *tasks.add_tasks() = Spec("t3", "images");
    Await<v1::SubmitTasksResponse>(
        [&](auto done) { engine->SubmitTasks(std::move(tasks), std::move(done)); });
    v1::SubmitJobRequest job;
    job.set_job_id("j1");
    *job.add_tasks() = Spec("j1-a", "default");
    v1::TaskSpec b = Spec("j1-b", "default");
    b.add_depends_on("j1-a");
    *job.add_tasks() = b;
    Await<v1::Job>([&](auto done) { engine->SubmitJob(std::move(job), std::move(done)); });
    engine->Sync();

    auto parsed = service::TokenTable::Parse(
        "watcher reader fuzz-reader-token\n"
        "ci submitter fuzz-submitter-token\n"
        "ops admin fuzz-admin-token\n",
        "fuzz tokens");
    if (!parsed.ok()) Die(parsed.status().ToString().c_str());
    tokens = std::make_unique<service::ReloadableTokens>("fuzz tokens", *std::move(parsed));
    http::Api::Options api_opts;
    api_opts.tokens = tokens.get();
    api_opts.listen_host = "127.0.0.1";
    api_opts.hosts = {"head.example"};
    // Long polls answer at once: Handle waits for the answer, and the
    // fake clock never runs a wait out.
    api_opts.max_wait = absl::ZeroDuration();
    api = std::make_unique<http::Api>(engine.get(), api_opts);
    api->Register(&server);
  }
};

// %XX decoded; a '%' without two hex digits stays as it is.
std::string Unescape(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && absl::ascii_isxdigit(s[i + 1]) &&
        absl::ascii_isxdigit(s[i + 2])) {
      auto hex = [](char c) { return absl::ascii_isdigit(c) ? c - '0' : (c | 0x20) - 'a' + 10; };
      out.push_back(static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2])));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

http::Request Parse(absl::string_view input) {
  http::Request r;
  const size_t head_end = input.find("\n\n");
  const absl::string_view head = input.substr(0, head_end);
  if (head_end != absl::string_view::npos) r.body = std::string(input.substr(head_end + 2));
  std::vector<absl::string_view> lines = absl::StrSplit(head, '\n');
  const absl::string_view first = absl::StripSuffix(lines[0], "\r");
  const size_t space = first.find(' ');
  r.method = std::string(first.substr(0, space));
  absl::string_view target = space == absl::string_view::npos ? "" : first.substr(space + 1);
  const size_t q = target.find('?');
  r.path = Unescape(target.substr(0, q));
  if (q != absl::string_view::npos) {
    for (absl::string_view pair : absl::StrSplit(target.substr(q + 1), '&')) {
      if (pair.empty()) continue;
      const size_t eq = pair.find('=');
      r.query.emplace_back(Unescape(pair.substr(0, eq)),
                           eq == absl::string_view::npos ? "" : Unescape(pair.substr(eq + 1)));
    }
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    const absl::string_view line = absl::StripSuffix(lines[i], "\r");
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;
    r.headers.emplace(absl::AsciiStrToLower(line.substr(0, colon)),
                      std::string(absl::StripAsciiWhitespace(line.substr(colon + 1))));
  }
  return r;
}

void Check(const http::Request& req, const http::Response& res) {
  if (res.status < 200 || res.status > 599) Die("a status outside 200-599");
  if (res.status == 500) {
    std::fprintf(stderr, "500 for %s %s: %s\n", req.method.c_str(), req.path.c_str(),
                 res.body.c_str());
    Die("an internal error");
  }
  if (!absl::StartsWith(req.path, "/api/")) return;
  if (!absl::StartsWith(res.content_type, "application/json")) {
    Die("an API answer that is not JSON");
  }
  if (req.method == "HEAD") return;
  google::protobuf::Value body;
  if (!google::protobuf::util::JsonStringToMessage(res.body, &body).ok()) {
    std::fprintf(stderr, "%d %s\n", res.status, res.body.c_str());
    Die("an API body that does not parse as JSON");
  }
  if (res.status >= 400) {
    const auto& fields = body.struct_value().fields();
    auto code = fields.find("code");
    auto message = fields.find("message");
    if (code == fields.end() || code->second.string_value().empty() || message == fields.end() ||
        message->second.string_value().empty()) {
      std::fprintf(stderr, "%d %s\n", res.status, res.body.c_str());
      Die("an API error without a code and a message");
    }
  }
}

}  // namespace
}  // namespace taskgrid::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace taskgrid::fuzz;
  // A World lives across inputs, as the scheduler's Engine does, but a
  // fresh one comes every kInputsPerWorld: what inputs submit piles up in
  // it (and the invariant check after every operation reads all of it),
  // which would slow every later input down. The last one is stopped at
  // exit, before the statics its threads use are destroyed.
  constexpr int kInputsPerWorld = 5000;
  static World* world = nullptr;
  static int inputs = 0;
  if (world == nullptr || ++inputs % kInputsPerWorld == 0) {
    delete world;
    world = new World;
    static const bool registered = (std::atexit([] { delete world; }), true);
    (void)registered;
  }
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  const taskgrid::http::Request req = Parse(input);
  const taskgrid::http::Response res = world->server.Handle(req);
  Check(req, res);
  // To see what a seed reaches: TASKGRID_FUZZ_VERBOSE=1 fuzz_http_replay FILE.
  static const bool verbose = std::getenv("TASKGRID_FUZZ_VERBOSE") != nullptr;
  if (verbose) {
    std::fprintf(stderr, "%s %s -> %d %.200s\n", req.method.c_str(), req.path.c_str(), res.status,
                 res.body.c_str());
  }
  return 0;
}
