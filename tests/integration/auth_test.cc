// The trust boundary without a network: the role table and tokens file
// (TokenTable) as TokenAuth applies them, the agent id <-> certificate
// binding, and common/tls's file handling. TokenAuth::Process is called directly, as gRPC's server
// auth filter calls it, with the metadata a call carries (":path", "authorization"); the TLS
// handshake itself is covered by the system test tests/system/tls_test.py.
#include "scheduler/service/auth.h"

#include <gmock/gmock.h>
#include <google/protobuf/descriptor.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "common/tls.h"
#include "taskgrid/v1/agent_service.grpc.pb.h"
#include "taskgrid/v1/board_service.grpc.pb.h"
#include "taskgrid/v1/cluster_service.grpc.pb.h"
#include "taskgrid/v1/job_service.grpc.pb.h"
#include "taskgrid/v1/schedule_service.grpc.pb.h"
#include "taskgrid/v1/task_service.grpc.pb.h"
#include "tests/testing/temp_dir.h"

namespace taskgrid::service {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// An AuthContext holding properties in a multimap (gRPC's own one is built
// only from a real call).
class FakeAuthContext final : public grpc::AuthContext {
 public:
  bool IsPeerAuthenticated() const override { return false; }
  std::vector<grpc::string_ref> GetPeerIdentity() const override { return {}; }
  std::string GetPeerIdentityPropertyName() const override { return ""; }
  std::vector<grpc::string_ref> FindPropertyValues(const std::string& name) const override {
    std::vector<grpc::string_ref> out;
    auto [begin, end] = props_.equal_range(name);
    for (auto it = begin; it != end; ++it) out.emplace_back(it->second);
    return out;
  }
  grpc::AuthPropertyIterator begin() const override { return EmptyIterator(); }
  grpc::AuthPropertyIterator end() const override { return EmptyIterator(); }
  void AddProperty(const std::string& key, const grpc::string_ref& value) override {
    props_.emplace(key, std::string(value.data(), value.size()));
  }
  bool SetPeerIdentityPropertyName(const std::string&) override { return false; }

 private:
  struct EmptyIterator : grpc::AuthPropertyIterator {};
  std::multimap<std::string, std::string> props_;
};

const char kTokens[] =
    "# name   roles            token\n"
    "rita     reader           reader-token-0123456789\n"
    "\n"
    "sam      submitter        submitter-token-0123456789   # trailing comment\n"
    "w1       agent            agent-token-0123456789\n"
    "ada      admin            admin-token-0123456789\n"
    "ops      reader,agent     ops-token-0123456789\n";

std::unique_ptr<TokenAuth> MakeAuth() {
  auto table = TokenTable::Parse(kTokens, "tokens");
  EXPECT_TRUE(table.ok()) << table.status();
  if (!table.ok()) return nullptr;
  return std::make_unique<TokenAuth>(std::make_shared<ReloadableTokens>(
      "tokens", std::shared_ptr<const TokenTable>(std::move(*table))));
}

// Process() as gRPC calls it for `method` with `token` ("" = none).
struct Outcome {
  grpc::Status status;
  std::string principal;  // the property set on the AuthContext
  std::vector<std::string> consumed;
};
Outcome Call(TokenAuth& auth, const std::string& method, const std::string& token) {
  const std::string bearer = "Bearer " + token;
  TokenAuth::InputMetadata md;
  md.emplace(":path", method);
  md.emplace(":authority", "127.0.0.1:7070");
  md.emplace("user-agent", "test");
  if (!token.empty()) md.emplace("authorization", bearer);
  FakeAuthContext ctx;
  TokenAuth::OutputMetadata consumed, response;
  Outcome out;
  out.status = auth.Process(md, &ctx, &consumed, &response);
  for (const grpc::string_ref& v : ctx.FindPropertyValues(kPrincipalProperty)) {
    out.principal.assign(v.data(), v.size());
  }
  for (const auto& [k, v] : consumed) out.consumed.push_back(k);
  return out;
}

TEST(TokenAuth, EveryMethodTheSchedulerServesHasARole) {
  // A new RPC must be placed in the table on purpose (else only admin may
  // call it): this fails until it is.
  int methods = 0;
  int services = 0;
  for (const google::protobuf::FileDescriptor* file :
       {v1::SubmitTasksRequest::descriptor()->file(), v1::SubmitJobRequest::descriptor()->file(),
        v1::ListAgentsRequest::descriptor()->file(), v1::AgentMessage::descriptor()->file(),
        v1::ClaimRequest::descriptor()->file(), v1::CreateScheduleRequest::descriptor()->file()}) {
    for (int s = 0; s < file->service_count(); ++s, ++services) {
      const google::protobuf::ServiceDescriptor* service = file->service(s);
      for (int i = 0; i < service->method_count(); ++i) {
        const std::string full = "/" + service->full_name() + "/" + service->method(i)->name();
        EXPECT_EQ(MethodRoles().count(full), 1u) << full << " is not in MethodRoles()";
        ++methods;
      }
    }
  }
  EXPECT_EQ(services, 6);
  // The table names nothing the scheduler does not serve, besides health and reflection.
  int none = 0;
  for (const auto& [method, role] : MethodRoles()) none += role == Role::kNone;
  EXPECT_EQ(static_cast<int>(MethodRoles().size()), methods + none);
}

TEST(TokenAuth, EachRoleCallsWhatItMayAndNothingElse) {
  auto auth = MakeAuth();
  ASSERT_NE(auth, nullptr);
  // One read and one change of every service.
  const std::vector<std::string> methods = {
      "/taskgrid.v1.TaskService/GetTask",       "/taskgrid.v1.TaskService/WatchTasks",
      "/taskgrid.v1.TaskService/SubmitTasks",   "/taskgrid.v1.TaskService/CancelTask",
      "/taskgrid.v1.JobService/ListJobs",       "/taskgrid.v1.JobService/SubmitJob",
      "/taskgrid.v1.ClusterService/ListAgents", "/taskgrid.v1.ClusterService/GetClusterStats",
      "/taskgrid.v1.ClusterService/DrainAgent", "/taskgrid.v1.AgentService/Connect",
      "/taskgrid.v1.BoardService/Claim",        "/taskgrid.v1.BoardService/RestoreTask",
  };
  // token -> which of `methods` it may call (1) or not (0).
  const std::map<std::string, std::vector<int>> allowed = {
      {"reader-token-0123456789", {1, 1, 0, 0, 1, 0, 1, 1, 0, 0, 0, 0}},
      {"submitter-token-0123456789", {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1}},
      {"agent-token-0123456789", {0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0}},
      {"admin-token-0123456789", {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}},
      {"ops-token-0123456789", {1, 1, 0, 0, 1, 0, 1, 1, 0, 1, 1, 0}},
  };
  const std::map<std::string, std::string> names = {{"reader-token-0123456789", "rita"},
                                                    {"submitter-token-0123456789", "sam"},
                                                    {"agent-token-0123456789", "w1"},
                                                    {"admin-token-0123456789", "ada"},
                                                    {"ops-token-0123456789", "ops"}};
  for (const auto& [token, may] : allowed) {
    for (size_t i = 0; i < methods.size(); ++i) {
      SCOPED_TRACE(names.at(token) + " calls " + methods[i]);
      Outcome out = Call(*auth, methods[i], token);
      if (may[i]) {
        EXPECT_TRUE(out.status.ok()) << out.status.error_message();
        EXPECT_EQ(out.principal, names.at(token));
      } else {
        EXPECT_EQ(out.status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
        EXPECT_THAT(out.status.error_message(), HasSubstr(names.at(token)));
        EXPECT_THAT(out.status.error_message(),
                    HasSubstr("needs role " + RoleName(RequiredRole(methods[i]))));
        EXPECT_THAT(out.status.error_message(), Not(HasSubstr(token)));
        EXPECT_EQ(out.principal, "");
      }
      // Handlers never see the token.
      EXPECT_EQ(out.consumed, std::vector<std::string>{"authorization"});
    }
  }
}

TEST(TokenAuth, MissingOrUnknownTokenIsUnauthenticated) {
  auto auth = MakeAuth();
  ASSERT_NE(auth, nullptr);
  for (const std::string& token : {std::string(), std::string("no-such-token-0123456789"),
                                   std::string("reader-token-012345678")}) {
    Outcome out = Call(*auth, "/taskgrid.v1.TaskService/GetTask", token);
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << token;
    EXPECT_EQ(out.principal, "");
  }
  // Not a bearer token at all.
  TokenAuth::InputMetadata md;
  md.emplace(":path", "/taskgrid.v1.TaskService/GetTask");
  md.emplace("authorization", "Basic cml0YTpzZWNyZXQ=");
  FakeAuthContext ctx;
  TokenAuth::OutputMetadata consumed, response;
  EXPECT_EQ(auth->Process(md, &ctx, &consumed, &response).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

TEST(TokenAuth, HealthAndReflectionNeedNoToken) {
  auto auth = MakeAuth();
  ASSERT_NE(auth, nullptr);
  for (const char* method : {"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch",
                             "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"}) {
    EXPECT_TRUE(Call(*auth, method, "").status.ok()) << method;
  }
}

TEST(TokenAuth, UnknownMethodNeedsAdmin) {
  auto auth = MakeAuth();
  ASSERT_NE(auth, nullptr);
  const std::string method = "/taskgrid.v1.TaskService/NotYetInTheTable";
  EXPECT_EQ(Call(*auth, method, "submitter-token-0123456789").status.error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Call(*auth, method, "").status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(Call(*auth, method, "admin-token-0123456789").status.ok());
  // No :path at all is no method anyone but admin may call either.
  EXPECT_EQ(Call(*auth, "", "reader-token-0123456789").status.error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

TEST(TokenTable, BadTokensFileNamesTheLine) {
  struct Case {
    std::string text;
    std::string error;
  };
  const std::vector<Case> cases = {
      {"a reader token-0123456789abc\nb reader\n", "tokens.txt:2: expected 'NAME ROLE"},
      {"# c\n\na writer token-0123456789abc\n", "tokens.txt:3: unknown role 'writer'"},
      {"a reader,,admin token-0123456789abc\n", "tokens.txt:1: unknown role ''"},
      {"a reader short\n", "tokens.txt:1: the token of a is shorter than 16"},
      {"a reader token-0123456789abc\nb admin token-0123456789abc\n",
       "tokens.txt:2: the token of b is already the token of a"},
      {"a reader token-0123456789abc\na admin token-0123456789xyz\n",
       "tokens.txt:2: principal a is named twice"},
      {"# only comments\n\n", "tokens.txt: no tokens in it"},
      {"w agent token-0123456789abc w1\n", "tokens.txt:1: the fourth field must be ids="},
      {"w agent token-0123456789abc ids=\n", "tokens.txt:1: the fourth field must be ids="},
      {"w agent token-0123456789abc ids=w1,a/b\n", "tokens.txt:1: 'a/b' in ids="},
      {"w agent token-0123456789abc ids=w*x\n", "tokens.txt:1: 'w*x' in ids="},
      {"w agent token-0123456789abc ids=w1 x\n", "tokens.txt:1: expected 'NAME ROLE"},
  };
  for (const Case& c : cases) {
    auto auth = TokenTable::Parse(c.text, "tokens.txt");
    ASSERT_FALSE(auth.ok()) << c.text;
    EXPECT_EQ(auth.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(auth.status().message()), HasSubstr(c.error)) << c.text;
    EXPECT_THAT(std::string(auth.status().message()), Not(HasSubstr("token-0123456789")));
  }
}

TEST(TokenTable, FromFileReadsTheFileAndNamesIt) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/tokens";
  std::ofstream(path) << kTokens;
  auto auth = TokenTable::FromFile(path);
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_EQ((*auth)->size(), 5u);
  std::ofstream(path) << "x admin\n";
  auth = TokenTable::FromFile(path);
  ASSERT_FALSE(auth.ok());
  EXPECT_THAT(std::string(auth.status().message()), HasSubstr(path + ":1:"));
  auth = TokenTable::FromFile(dir.path() + "/missing");
  ASSERT_FALSE(auth.ok());
  EXPECT_THAT(std::string(auth.status().message()), HasSubstr(dir.path() + "/missing"));
}

// With tokens, an agent id (or board owner) must be one the token names:
// its principal's own name unless ids= says otherwise.
TEST(TokenTable, ATokenActsOnlyAsTheIdsItNames) {
  auto auth = TokenTable::Parse(
      "w1 agent token-w1-0123456789\n"
      "pool agent token-pool-0123456789 ids=gpu-*,cpu-1\n"
      "any agent token-any-0123456789 ids=*\n",
      "tokens");
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_TRUE((*auth)->CheckActsAs("w1", "w1", "agent id").ok());
  absl::Status s = (*auth)->CheckActsAs("w1", "w2", "agent id");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("agent id w2 is not one the token of w1 may act as (it may: w1)"));
  EXPECT_TRUE((*auth)->CheckActsAs("pool", "gpu-7", "agent id").ok());
  EXPECT_TRUE((*auth)->CheckActsAs("pool", "cpu-1", "owner").ok());
  EXPECT_FALSE((*auth)->CheckActsAs("pool", "cpu-12", "owner").ok());
  EXPECT_FALSE((*auth)->CheckActsAs("pool", "pool", "agent id").ok());
  EXPECT_THAT(std::string((*auth)->CheckActsAs("pool", "w1", "owner").message()),
              HasSubstr("owner w1 is not one the token of pool may act as (it may: gpu-*, cpu-1)"));
  EXPECT_TRUE((*auth)->CheckActsAs("any", "whatever", "agent id").ok());
  EXPECT_FALSE((*auth)->CheckActsAs("", "w1", "agent id").ok()) << "no token, no id";
  EXPECT_FALSE((*auth)->CheckActsAs("nobody", "nobody", "agent id").ok());
}

// Both proofs apply when both are on: the certificate's names and the
// token's ids.
TEST(CallerIdentity, EveryProofGivenMustAllowTheId) {
  auto auth = TokenTable::Parse("w1 agent token-w1-0123456789\n", "tokens");
  ASSERT_TRUE(auth.ok());
  ReloadableTokens tokens("tokens", std::move(*auth));
  CallerIdentity none;
  EXPECT_TRUE(none.Check("anything").ok());
  CallerIdentity cert;
  cert.cert_names = std::vector<std::string>{"w1", "w2"};
  EXPECT_TRUE(cert.Check("w2").ok());
  CallerIdentity both = cert;
  both.tokens = &tokens;
  both.principal = "w1";
  EXPECT_TRUE(both.Check("w1").ok());
  EXPECT_EQ(both.Check("w2").code(), absl::StatusCode::kPermissionDenied) << "the token says no";
  EXPECT_EQ(both.Check("w3").code(), absl::StatusCode::kPermissionDenied);
}

// A reloaded tokens file applies to the next call: the processor takes
// the current table for each call.
TEST(TokenAuth, AReloadAppliesToTheNextCall) {
  auto first = TokenTable::Parse("rita reader reader-token-0123456789\n", "tokens");
  ASSERT_TRUE(first.ok());
  auto tokens = std::make_shared<ReloadableTokens>("tokens", std::move(*first));
  TokenAuth auth(tokens);
  const std::string list = "/taskgrid.v1.TaskService/ListTasks";
  EXPECT_TRUE(Call(auth, list, "reader-token-0123456789").status.ok());
  EXPECT_EQ(Call(auth, list, "new-token-0123456789").status.error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  auto second = TokenTable::Parse("nia reader new-token-0123456789\n", "tokens");
  ASSERT_TRUE(second.ok());
  tokens->Replace(std::move(*second));
  Outcome added = Call(auth, list, "new-token-0123456789");
  EXPECT_TRUE(added.status.ok()) << added.status.error_message();
  EXPECT_EQ(added.principal, "nia");
  EXPECT_EQ(Call(auth, list, "reader-token-0123456789").status.error_code(),
            grpc::StatusCode::UNAUTHENTICATED)
      << "a removed token is refused";
}

// A stream outlives a reload: CheckStill, on each of its messages, refuses
// it once its principal is gone, lacks the role, or may no longer act as
// its id.
TEST(CallerIdentity, AStreamIsCheckedAgainstTheCurrentTable) {
  const std::string connect = "/taskgrid.v1.AgentService/Connect";
  auto table = TokenTable::Parse("w1 agent token-w1-0123456789\n", "tokens");
  ASSERT_TRUE(table.ok());
  ReloadableTokens tokens("tokens", std::move(*table));
  CallerIdentity caller;
  caller.tokens = &tokens;
  caller.principal = "w1";
  EXPECT_TRUE(caller.CheckStill(connect, "w1").ok());

  tokens.Replace(*TokenTable::Parse("w1 reader token-w1-0123456789\n", "tokens"));
  absl::Status s = caller.CheckStill(connect, "w1");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(s.message()), HasSubstr("needs role agent"));

  tokens.Replace(*TokenTable::Parse("w1 agent token-w1-0123456789 ids=w2\n", "tokens"));
  EXPECT_EQ(caller.CheckStill(connect, "w1").code(), absl::StatusCode::kPermissionDenied);

  tokens.Replace(*TokenTable::Parse("w2 agent token-w2-0123456789\n", "tokens"));
  s = caller.CheckStill(connect, "w1");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("the token of w1 is no longer in the tokens file"));

  CallerIdentity no_tokens;
  EXPECT_TRUE(no_tokens.CheckStill(connect, "w1").ok());
}

TEST(AgentIdentity, IdMustBeANameOfTheCertificate) {
  EXPECT_TRUE(CheckAgentIdentity("w1", {"w1"}).ok());
  EXPECT_TRUE(CheckAgentIdentity("w1.example", {"w1", "w1.example"}).ok());
  absl::Status s = CheckAgentIdentity("w2", {"w1", "w1.example"});
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(s.message()), HasSubstr("agent id w2"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("w1, w1.example"));
  // A peer without a certificate names nothing.
  EXPECT_EQ(CheckAgentIdentity("w1", {}).code(), absl::StatusCode::kPermissionDenied);
}

TEST(Tls, PeerCertificateNamesAreTheCommonNameThenTheAlternativeNames) {
  FakeAuthContext ctx;
  ctx.AddProperty("x509_common_name", "w1");
  ctx.AddProperty("x509_subject_alternative_name", "w1");
  ctx.AddProperty("x509_subject_alternative_name", "w1.example");
  ctx.AddProperty("x509_pem_cert", "-----BEGIN CERTIFICATE-----");
  EXPECT_EQ(PeerCertificateNames(ctx), (std::vector<std::string>{"w1", "w1.example"}));
  EXPECT_TRUE(PeerCertificateNames(FakeAuthContext()).empty());
}

TEST(Tls, ReadTokenTrimsAndRefusesEmpty) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/token";
  std::ofstream(path) << "  secret-0123456789\n\n";
  auto token = ReadToken(path);
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "secret-0123456789");
  std::ofstream(path) << " \n\t\n";
  token = ReadToken(path);
  ASSERT_FALSE(token.ok());
  EXPECT_THAT(std::string(token.status().message()), HasSubstr(path + ": empty"));
  std::ofstream(path) << "two words\n";
  EXPECT_FALSE(ReadToken(path).ok());
  token = ReadToken(dir.path() + "/missing");
  ASSERT_FALSE(token.ok());
  EXPECT_THAT(std::string(token.status().message()), HasSubstr(dir.path() + "/missing"));
}

TEST(Tls, CredentialErrorsNameTheFileOrTheFlag) {
  testing::TempDir dir;
  const std::string not_pem = dir.path() + "/not.pem";
  std::ofstream(not_pem) << "hello\n";
  auto server = ServerCredentials({not_pem, not_pem, ""});
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(std::string(server.status().message()), HasSubstr("--tls_cert"));
  EXPECT_THAT(std::string(server.status().message()), HasSubstr(not_pem));
  server = ServerCredentials({dir.path() + "/missing.pem", not_pem, ""});
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(std::string(server.status().message()), HasSubstr(dir.path() + "/missing.pem"));
  EXPECT_FALSE(ServerCredentials({"", "", not_pem}).ok());

  // Plaintext only when nothing is given; a token or a certificate needs a CA.
  EXPECT_TRUE(ChannelCredentials({"", "", ""}).ok());
  auto client = ChannelCredentials({"", "", ""}, "a-token-0123456789");
  ASSERT_FALSE(client.ok());
  EXPECT_THAT(std::string(client.status().message()), HasSubstr("--tls_ca"));
  EXPECT_FALSE(ChannelCredentials({not_pem, not_pem, ""}).ok());
  client = ChannelCredentials({not_pem, "", not_pem});
  ASSERT_FALSE(client.ok());
  EXPECT_THAT(std::string(client.status().message()), HasSubstr("go together"));
  client = ChannelCredentials({"", "", not_pem});
  ASSERT_FALSE(client.ok());
  EXPECT_THAT(std::string(client.status().message()), HasSubstr("--tls_ca"));
  EXPECT_THAT(std::string(client.status().message()), HasSubstr(not_pem));
}

}  // namespace
}  // namespace taskgrid::service
