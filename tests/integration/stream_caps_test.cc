// Health watches and reflection streams, which anyone may open: served
// without a thread per stream, capped per connection and in total
// (scheduler/service/stream_caps.h), and the places of closed streams
// freed. Over real gRPC on 127.0.0.1, with the server's default caps (100
// per connection, 1,000 in total).
#include "scheduler/service/stream_caps.h"

#include <gmock/gmock.h>
#include <google/protobuf/descriptor.pb.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1/reflection.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "scheduler/service/standby_server.h"
#include "tests/integration/cluster.h"

namespace taskgrid::testing::stream_caps_test {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;
namespace refl = grpc::reflection::v1alpha;
using ::testing::HasSubstr;

constexpr int kPerConnection = 100;  // StreamLimits' defaults
constexpr int kTotal = 1000;
// What 1,000 streams may add to the process's threads (the client's and
// the server's): a thread per stream would add 1,000.
constexpr int kThreadSlack = 50;

int Threads() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// A channel of its own TCP connection (a channel argument no other channel
// has keeps gRPC from sharing a connection between them).
std::shared_ptr<grpc::Channel> Connection(const std::string& addr, int i) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt("taskgrid.test_connection", i);
  return grpc::CreateCustomChannel(addr, grpc::InsecureChannelCredentials(), args);
}

std::unique_ptr<grpc::ClientContext> LongCtx() { return InProcessCluster::Ctx(absl::Seconds(120)); }

struct Watch {
  std::unique_ptr<grpc::ClientContext> ctx = LongCtx();
  std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> reader;
};

Watch StartWatch(Health::Stub& stub, const std::string& service = "") {
  Watch w;
  HealthCheckRequest req;
  req.set_service(service);
  w.reader = stub.Watch(w.ctx.get(), req);
  return w;
}

// The next status a watch says, or -1 when it ended.
int NextStatus(Watch& w) {
  HealthCheckResponse resp;
  if (!w.reader->Read(&resp)) return -1;
  return resp.status();
}

void ExpectRefused(Watch& w, const std::string& message) {
  EXPECT_EQ(NextStatus(w), -1);
  grpc::Status s = w.reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(s.error_message(), message);
}

void Close(Watch& w) {
  w.ctx->TryCancel();
  HealthCheckResponse resp;
  while (w.reader->Read(&resp)) {
  }
  w.reader->Finish();
}

HealthCheckResponse::ServingStatus Check(const std::shared_ptr<grpc::Channel>& ch,
                                         const std::string& service = "",
                                         grpc::Status* status = nullptr) {
  HealthCheckRequest req;
  req.set_service(service);
  HealthCheckResponse resp;
  grpc::Status s = Health::NewStub(ch)->Check(InProcessCluster::Ctx().get(), req, &resp);
  if (status != nullptr) *status = s;
  return resp.status();
}

TEST(StreamCaps, CountsPerPeerAndInTotalAndFreesPlaces) {
  service::StreamCaps caps("things", {2, 3});
  EXPECT_TRUE(caps.Take("a").ok());
  EXPECT_TRUE(caps.Take("a").ok());
  grpc::Status s = caps.Take("a");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(s.error_message(), "too many things from this connection: at most 2");
  EXPECT_TRUE(caps.Take("b").ok());
  s = caps.Take("c");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(s.error_message(), "too many things open on this server: at most 3");
  EXPECT_EQ(caps.open(), 3);
  caps.Give("a");
  EXPECT_EQ(caps.open_from("a"), 1);
  EXPECT_TRUE(caps.Take("c").ok());
  caps.Give("b");
  caps.Give("c");
  caps.Give("a");
  EXPECT_EQ(caps.open(), 0);
  EXPECT_TRUE(caps.Take("a").ok());
}

TEST(HealthWatch, AThousandWatchesTakeNoThreadEachAndArePerConnectionAndTotalCapped) {
  InProcessCluster c;
  const service::HealthService& health = c.server().health();
  std::vector<std::shared_ptr<grpc::Channel>> chans;
  for (int i = 0; i <= kTotal / kPerConnection; ++i) chans.push_back(Connection(c.addr(), i));
  // Every connection up and gRPC's threads started before counting.
  for (auto& ch : chans) ASSERT_EQ(Check(ch), HealthCheckResponse::SERVING);
  const int threads_before = Threads();

  std::vector<std::vector<Watch>> watches(chans.size());
  for (size_t i = 0; i + 1 < chans.size(); ++i) {
    auto stub = Health::NewStub(chans[i]);
    for (int k = 0; k < kPerConnection; ++k) {
      watches[i].push_back(StartWatch(*stub));
      ASSERT_EQ(NextStatus(watches[i].back()), HealthCheckResponse::SERVING) << i << "/" << k;
    }
    // One more from this connection is refused at once.
    Watch extra = StartWatch(*stub);
    ExpectRefused(extra, "too many health watches from this connection: at most 100");
  }
  EXPECT_EQ(health.watches().open(), kTotal);
  const int threads_during = Threads();
  EXPECT_LT(threads_during, threads_before + kThreadSlack)
      << "threads: " << threads_before << " before " << kTotal << " watches, " << threads_during
      << " with them open";
  std::cout << "threads: " << threads_before << " before " << kTotal << " health watches, "
            << threads_during << " with them open\n";

  // A fresh connection: its first watch passes the total.
  auto last = Health::NewStub(chans.back());
  Watch over = StartWatch(*last);
  ExpectRefused(over, "too many health watches open on this server: at most 1000");

  // Unary calls still answer meanwhile, on a full connection too.
  EXPECT_EQ(Check(chans[0]), HealthCheckResponse::SERVING);
  v1::GetQueueStatsRequest sreq;
  v1::GetQueueStatsResponse sresp;
  EXPECT_TRUE(c.tasks().GetQueueStats(InProcessCluster::Ctx().get(), sreq, &sresp).ok());

  // Closing watches frees their places: the connection's and the total's.
  for (Watch& w : watches[0]) Close(w);
  ASSERT_TRUE(InProcessCluster::Eventually(
      [&] { return health.watches().open() == kTotal - kPerConnection; }, absl::Seconds(30)));
  watches[0].clear();
  auto first = Health::NewStub(chans[0]);
  watches[0].push_back(StartWatch(*first));
  EXPECT_EQ(NextStatus(watches[0].back()), HealthCheckResponse::SERVING);
  watches.back().push_back(StartWatch(*last));
  EXPECT_EQ(NextStatus(watches.back().back()), HealthCheckResponse::SERVING);

  // Shutting the server down: every watch says NOT_SERVING, then ends.
  // The server ends each with CANCELLED; a watch whose connection closes
  // before that status reaches the client (the shutdown's deadline passed
  // on a loaded machine) ends UNAVAILABLE on the client's side. Either way
  // it ends, and never OK.
  c.server().Shutdown(absl::Seconds(30));
  int open = 0, not_serving = 0;
  for (auto& on_conn : watches) {
    for (Watch& w : on_conn) {
      ++open;
      if (NextStatus(w) == HealthCheckResponse::NOT_SERVING) ++not_serving;
      EXPECT_EQ(NextStatus(w), -1);
      const grpc::StatusCode code = w.reader->Finish().error_code();
      EXPECT_TRUE(code == grpc::StatusCode::CANCELLED || code == grpc::StatusCode::UNAVAILABLE)
          << code;
    }
  }
  EXPECT_EQ(open, kTotal - kPerConnection + 2);
  EXPECT_EQ(not_serving, open);
  EXPECT_EQ(health.watches().open(), 0);
}

TEST(HealthWatch, NamedServicesAreUnknownAsGrpcsDefaultServiceAnswers) {
  InProcessCluster c;
  auto ch = Connection(c.addr(), 0);
  grpc::Status s;
  Check(ch, "taskgrid.v1.TaskService", &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  auto stub = Health::NewStub(ch);
  Watch w = StartWatch(*stub, "taskgrid.v1.TaskService");
  EXPECT_EQ(NextStatus(w), HealthCheckResponse::SERVICE_UNKNOWN);
  Watch overall = StartWatch(*stub);
  EXPECT_EQ(NextStatus(overall), HealthCheckResponse::SERVING);
  c.server().Shutdown(absl::Seconds(10));
  // The unknown one has nothing new to say; it ends.
  EXPECT_EQ(NextStatus(w), -1);
  EXPECT_EQ(w.reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(NextStatus(overall), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(NextStatus(overall), -1);
}

TEST(HealthWatch, AStandbyIsNotServingUntilItStops) {
  service::ServerOptions opts;
  opts.listen = "127.0.0.1:0";
  auto standby = service::StandbyServer::Start(opts);
  ASSERT_TRUE(standby.ok()) << standby.status();
  auto ch = Connection("127.0.0.1:" + std::to_string((*standby)->port()), 0);
  auto stub = Health::NewStub(ch);
  Watch w = StartWatch(*stub);
  EXPECT_EQ(NextStatus(w), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(Check(ch), HealthCheckResponse::NOT_SERVING);
  (*standby)->Shutdown();
  EXPECT_EQ(NextStatus(w), -1);
  EXPECT_EQ(w.reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

struct Reflection {
  std::unique_ptr<grpc::ClientContext> ctx = LongCtx();
  std::unique_ptr<
      grpc::ClientReaderWriter<refl::ServerReflectionRequest, refl::ServerReflectionResponse>>
      stream;
};

refl::ServerReflectionRequest Describe(const std::string& symbol) {
  refl::ServerReflectionRequest req;
  req.set_file_containing_symbol(symbol);
  return req;
}

// Opens a stream and has it answer one request (so it is surely open on
// the server); false if it was refused.
bool OpenReflection(refl::ServerReflection::Stub& stub, Reflection* r) {
  r->stream = stub.ServerReflectionInfo(r->ctx.get());
  refl::ServerReflectionRequest list;
  list.set_list_services("");
  r->stream->Write(list);
  refl::ServerReflectionResponse resp;
  return r->stream->Read(&resp) && resp.list_services_response().service_size() > 0;
}

TEST(Reflection, AThousandStreamsTakeNoThreadEachAndArePerConnectionAndTotalCapped) {
  InProcessCluster c;
  const service::ReflectionService& reflection = c.server().reflection();
  std::vector<std::shared_ptr<grpc::Channel>> chans;
  for (int i = 0; i <= kTotal / kPerConnection; ++i) chans.push_back(Connection(c.addr(), i));
  for (auto& ch : chans) ASSERT_EQ(Check(ch), HealthCheckResponse::SERVING);
  const int threads_before = Threads();

  std::vector<std::vector<Reflection>> streams(chans.size());
  for (size_t i = 0; i + 1 < chans.size(); ++i) {
    auto stub = refl::ServerReflection::NewStub(chans[i]);
    streams[i].resize(kPerConnection);
    for (int k = 0; k < kPerConnection; ++k) {
      ASSERT_TRUE(OpenReflection(*stub, &streams[i][k])) << i << "/" << k;
    }
    Reflection extra;
    EXPECT_FALSE(OpenReflection(*stub, &extra));
    grpc::Status s = extra.stream->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_EQ(s.error_message(), "too many reflection streams from this connection: at most 100");
  }
  EXPECT_EQ(reflection.streams().open(), kTotal);
  const int threads_during = Threads();
  EXPECT_LT(threads_during, threads_before + kThreadSlack)
      << "threads: " << threads_before << " before " << kTotal << " streams, " << threads_during
      << " with them open";
  std::cout << "threads: " << threads_before << " before " << kTotal << " reflection streams, "
            << threads_during << " with them open\n";

  // The total, from a fresh connection; the v1 service counts with v1alpha.
  {
    auto stub = grpc::reflection::v1::ServerReflection::NewStub(chans.back());
    grpc::ClientContext ctx;
    auto stream = stub->ServerReflectionInfo(&ctx);
    grpc::reflection::v1::ServerReflectionRequest req;
    req.set_list_services("");
    stream->Write(req);
    grpc::reflection::v1::ServerReflectionResponse resp;
    EXPECT_FALSE(stream->Read(&resp));
    grpc::Status s = stream->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_EQ(s.error_message(), "too many reflection streams open on this server: at most 1000");
  }

  // Unary calls still answer, and every open stream still answers.
  EXPECT_EQ(Check(chans[0]), HealthCheckResponse::SERVING);
  v1::GetQueueStatsRequest sreq;
  v1::GetQueueStatsResponse sresp;
  EXPECT_TRUE(c.tasks().GetQueueStats(InProcessCluster::Ctx().get(), sreq, &sresp).ok());
  for (auto& on_conn : streams) {
    for (Reflection& r : on_conn) {
      ASSERT_TRUE(r.stream->Write(Describe("taskgrid.v1.TaskService")));
      refl::ServerReflectionResponse resp;
      ASSERT_TRUE(r.stream->Read(&resp));
      EXPECT_GT(resp.file_descriptor_response().file_descriptor_proto_size(), 0);
    }
  }

  // Closing streams (the client is done sending) frees their places.
  for (Reflection& r : streams[0]) {
    r.stream->WritesDone();
    EXPECT_TRUE(r.stream->Finish().ok());
  }
  ASSERT_TRUE(InProcessCluster::Eventually(
      [&] { return reflection.streams().open() == kTotal - kPerConnection; }, absl::Seconds(30)));
  streams[0].clear();
  streams[0].resize(1);
  auto stub = refl::ServerReflection::NewStub(chans[0]);
  EXPECT_TRUE(OpenReflection(*stub, &streams[0][0]));
  for (auto& on_conn : streams) {
    for (Reflection& r : on_conn) {
      r.stream->WritesDone();
      EXPECT_TRUE(r.stream->Finish().ok());
    }
  }
  ASSERT_TRUE(InProcessCluster::Eventually([&] { return reflection.streams().open() == 0; },
                                           absl::Seconds(30)));
}

TEST(Reflection, AnswersAsGrpcsServiceDoes) {
  InProcessCluster c;
  auto ch = Connection(c.addr(), 0);
  auto stub = refl::ServerReflection::NewStub(ch);
  grpc::ClientContext ctx;
  auto stream = stub->ServerReflectionInfo(&ctx);
  auto ask = [&](const refl::ServerReflectionRequest& req) {
    EXPECT_TRUE(stream->Write(req));
    refl::ServerReflectionResponse resp;
    EXPECT_TRUE(stream->Read(&resp));
    EXPECT_EQ(resp.original_request().SerializeAsString(), req.SerializeAsString());
    return resp;
  };
  // Every service the server serves, reflection's own too.
  refl::ServerReflectionRequest list;
  list.set_host("h");
  list.set_list_services("*");
  refl::ServerReflectionResponse listed = ask(list);
  EXPECT_EQ(listed.valid_host(), "h");
  std::vector<std::string> names;
  for (const auto& s : listed.list_services_response().service()) names.push_back(s.name());
  EXPECT_THAT(names, ::testing::UnorderedElementsAre(
                         "taskgrid.v1.TaskService", "taskgrid.v1.AgentService",
                         "taskgrid.v1.ClusterService", "taskgrid.v1.JobService",
                         "taskgrid.v1.BoardService", "taskgrid.v1.ScheduleService",
                         "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
                         "grpc.reflection.v1.ServerReflection"));

  // A file comes with the files it depends on, each once.
  refl::ServerReflectionRequest by_name;
  by_name.set_file_by_filename("taskgrid/v1/task_service.proto");
  refl::ServerReflectionResponse file = ask(by_name);
  std::vector<std::string> files;
  for (const std::string& bytes : file.file_descriptor_response().file_descriptor_proto()) {
    google::protobuf::FileDescriptorProto fd;
    ASSERT_TRUE(fd.ParseFromString(bytes));
    files.push_back(fd.name());
  }
  ASSERT_FALSE(files.empty());
  EXPECT_EQ(files[0], "taskgrid/v1/task_service.proto");
  EXPECT_THAT(files, ::testing::Contains("taskgrid/v1/task.proto"));
  EXPECT_EQ(std::set<std::string>(files.begin(), files.end()).size(), files.size());

  refl::ServerReflectionResponse health = ask(Describe("grpc.health.v1.Health.Watch"));
  ASSERT_EQ(health.file_descriptor_response().file_descriptor_proto_size(), 1);

  // What the pool lacks: NOT_FOUND.
  refl::ServerReflectionResponse unknown = ask(Describe("no.such.Service"));
  EXPECT_EQ(unknown.error_response().error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(unknown.error_response().error_message(), "Symbol not found.");
  refl::ServerReflectionRequest no_file;
  no_file.set_file_by_filename("no/such.proto");
  EXPECT_EQ(ask(no_file).error_response().error_code(), grpc::StatusCode::NOT_FOUND);
  refl::ServerReflectionRequest no_ext;
  no_ext.mutable_file_containing_extension()->set_containing_type("taskgrid.v1.Task");
  no_ext.mutable_file_containing_extension()->set_extension_number(1000);
  EXPECT_EQ(ask(no_ext).error_response().error_message(), "Extension not found.");
  refl::ServerReflectionRequest exts;
  exts.set_all_extension_numbers_of_type("google.protobuf.FieldOptions");
  refl::ServerReflectionResponse numbers = ask(exts);
  EXPECT_FALSE(numbers.has_error_response());
  EXPECT_EQ(numbers.all_extension_numbers_response().base_type_name(),
            "google.protobuf.FieldOptions");
  refl::ServerReflectionRequest no_type;
  no_type.set_all_extension_numbers_of_type("no.Such");
  EXPECT_EQ(ask(no_type).error_response().error_message(), "Type not found.");

  // Requests sent ahead are answered one by one, in order.
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(stream->Write(Describe(i % 2 ? "taskgrid.v1.Task" : "no.such.Thing")));
  }
  for (int i = 0; i < 20; ++i) {
    refl::ServerReflectionResponse resp;
    ASSERT_TRUE(stream->Read(&resp));
    EXPECT_EQ(resp.original_request().file_containing_symbol(),
              i % 2 ? "taskgrid.v1.Task" : "no.such.Thing");
    EXPECT_EQ(resp.has_error_response(), i % 2 == 0);
  }
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST(Reflection, TheV1ServiceAnswersToo) {
  InProcessCluster c;
  auto stub = grpc::reflection::v1::ServerReflection::NewStub(Connection(c.addr(), 0));
  grpc::ClientContext ctx;
  auto stream = stub->ServerReflectionInfo(&ctx);
  grpc::reflection::v1::ServerReflectionRequest req;
  req.set_file_containing_symbol("taskgrid.v1.JobService");
  ASSERT_TRUE(stream->Write(req));
  grpc::reflection::v1::ServerReflectionResponse resp;
  ASSERT_TRUE(stream->Read(&resp));
  EXPECT_GT(resp.file_descriptor_response().file_descriptor_proto_size(), 0);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

}  // namespace
}  // namespace taskgrid::testing::stream_caps_test
