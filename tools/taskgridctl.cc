// taskgridctl: the command-line client of the Taskgrid scheduler.
//
// This file turns the command line into requests: it splits argv at the first
// `--` (what follows is the task's argv, never flags), checks every flag
// before Abseil parses them (so a bad flag is a usage error, exit 2, not
// Abseil's exit 1), checks that each flag applies to the command, and builds
// the request. tools/ctl/client.cc sends it and prints the answer.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "common/address.h"
#include "common/builtins.h"
#include "common/flags_help.h"
#include "common/proto_time.h"
#include "common/resources.h"
#include "common/secret_file.h"
#include "common/tls.h"
#include "scheduler/core/state_machine.h"
#include "scheduler/core/validate.h"
#include "tools/ctl/client.h"
#include "tools/ctl/command_line.h"
#include "tools/ctl/flags.h"
#include "tools/ctl/help.h"
#include "tools/ctl/parse.h"

namespace {

using taskgrid::ctl::Command;
using taskgrid::ctl::CommandHelp;
using taskgrid::ctl::Commands;
using taskgrid::ctl::FindCommand;
using taskgrid::ctl::GroupUsageText;
using taskgrid::ctl::kBoardCommands;
using taskgrid::ctl::kExitOk;
using taskgrid::ctl::kExitUsage;
using taskgrid::ctl::kJobCommands;
using taskgrid::ctl::kQueueCommands;
using taskgrid::ctl::kScheduleCommands;
using taskgrid::ctl::ReadInput;
using taskgrid::ctl::UsageText;
namespace v1 = taskgrid::v1;

int UsageError(const std::string& msg, const std::string& hint) {
  std::cerr << "error: " << msg << "\n" << hint << "\n";
  return kExitUsage;
}

int UsageError(const std::string& msg) {
  return UsageError(msg, "Run 'taskgridctl help' for usage.");
}

std::string ResolveAddr() {
  return taskgrid::FlagOrEnv(absl::GetFlag(FLAGS_addr), "TASKGRID_ADDR", taskgrid::kDefaultAddress);
}

// --tls_ca, --tls_cert, --tls_key (or their TASKGRID_* variables).
taskgrid::TlsFiles ResolveTlsFiles() {
  return {taskgrid::FlagOrEnv(absl::GetFlag(FLAGS_tls_cert), "TASKGRID_TLS_CERT", ""),
          taskgrid::FlagOrEnv(absl::GetFlag(FLAGS_tls_key), "TASKGRID_TLS_KEY", ""),
          taskgrid::FlagOrEnv(absl::GetFlag(FLAGS_tls_ca), "TASKGRID_TLS_CA", "")};
}

// The channel's credentials from --tls_* and --token_file (or their
// TASKGRID_* variables): plaintext when none is given.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ResolveCredentials() {
  const taskgrid::TlsFiles files = ResolveTlsFiles();
  std::string token;
  if (const std::string path =
          taskgrid::FlagOrEnv(absl::GetFlag(FLAGS_token_file), "TASKGRID_TOKEN_FILE", "");
      !path.empty()) {
    absl::StatusOr<std::string> t = taskgrid::ReadToken(path);
    if (!t.ok()) return t.status();
    token = *std::move(t);
    // As the scheduler says of its --tokens_file: a token others can read
    // is theirs too.
    if (std::string w = taskgrid::OthersMayReadWarning(path, "--token_file"); !w.empty()) {
      std::cerr << "warning: " << w << "\n";
    }
  }
  return taskgrid::ChannelCredentials(files, token);
}

// Builds the request of `submit`. `words` are the positional words after
// "submit", `argv` what follows `--`. Returns an exit code other than 0 on a
// usage error (already reported).
int BuildSubmit(const std::vector<std::string>& words, bool has_dashdash,
                const std::vector<std::string>& argv, const std::set<std::string>& set,
                v1::SubmitTasksRequest* req, const std::set<std::string>& also_with_file = {}) {
  const std::string file = absl::GetFlag(FLAGS_file);
  const std::string builtin = absl::GetFlag(FLAGS_builtin);
  if (set.count("file")) {
    for (const std::string& f : set) {
      if (f != "file" && f != "addr" && f != "json" && f != "timeout" && f != "wait" &&
          f != "wait_timeout" && also_with_file.count(f) == 0) {
        return UsageError(absl::StrCat("--", f, " does not combine with --file (set it in the ",
                                       "JSON); see 'taskgridctl help submit'"));
      }
    }
    if (!words.empty() || has_dashdash) {
      return UsageError("submit --file takes no program", "Usage: taskgridctl submit -f FILE");
    }
    if (file.empty()) return UsageError("--file is empty", "Usage: taskgridctl submit -f FILE");
    absl::StatusOr<std::string> text = ReadInput(file);
    if (!text.ok()) return UsageError(std::string(text.status().message()));
    absl::StatusOr<std::vector<v1::TaskSpec>> specs =
        taskgrid::ctl::ParseTaskSpecsJson(*text, file == "-" ? "<stdin>" : file);
    if (!specs.ok()) {
      return UsageError(std::string(specs.status().message()),
                        "Nothing was submitted. See 'taskgridctl help submit' for the format.");
    }
    for (v1::TaskSpec& s : *specs) *req->add_tasks() = std::move(s);
    return kExitOk;
  }

  v1::TaskSpec* spec = req->add_tasks();
  v1::Step* step = spec->add_steps();
  if (set.count("builtin")) {
    if (!taskgrid::builtins::IsKnown(builtin)) {
      return UsageError(absl::StrCat("--builtin=", builtin, ": not a builtin"),
                        absl::StrCat("Builtins: ", taskgrid::builtins::Usages()));
    }
    if (!words.empty() && !argv.empty()) {
      return UsageError("give the builtin's arguments either before or after --, not both");
    }
    for (const char* f : {"env", "cwd"}) {
      if (set.count(f)) {
        return UsageError(absl::StrCat("--", f, " applies to a program, not a builtin"));
      }
    }
    step->mutable_builtin()->set_name(builtin);
    for (const std::string& a : words.empty() ? argv : words) step->mutable_builtin()->add_args(a);
  } else {
    const std::string hint =
        "Usage: taskgridctl submit [FLAGS] -- PROGRAM [ARGS...]  (or --builtin=NAME, or -f FILE)";
    if (!words.empty()) {
      return UsageError(absl::StrCat("unexpected \"", words[0], "\": put the program after --"),
                        hint);
    }
    if (argv.empty() || argv[0].empty()) return UsageError("submit needs a program after --", hint);
    v1::ExecStep* exec = step->mutable_exec();
    for (const std::string& a : argv) exec->add_argv(a);
    auto env = taskgrid::ctl::ParseKeyValues("env", absl::GetFlag(FLAGS_env));
    if (!env.ok()) return UsageError(std::string(env.status().message()));
    for (const auto& [k, v] : *env) (*exec->mutable_env())[k] = v;
    exec->set_cwd(absl::GetFlag(FLAGS_cwd));
  }

  spec->set_id(absl::GetFlag(FLAGS_id));
  spec->set_queue(absl::GetFlag(FLAGS_queue));
  spec->set_priority(absl::GetFlag(FLAGS_priority));
  if (absl::GetFlag(FLAGS_max_attempts) < 0) return UsageError("--max_attempts is negative");
  spec->set_max_attempts(absl::GetFlag(FLAGS_max_attempts));
  if (!absl::GetFlag(FLAGS_merge_key).empty()) spec->set_merge_key(absl::GetFlag(FLAGS_merge_key));
  for (const char* f : {"unique_ttl", "unique_keep", "unique_refuse"}) {
    if (set.count(f) && absl::GetFlag(FLAGS_unique_key).empty()) {
      return UsageError(absl::StrCat("--", f, " needs --unique_key"));
    }
  }
  if (!absl::GetFlag(FLAGS_unique_key).empty()) {
    if (!set.count("unique_ttl")) {
      return UsageError("--unique_key needs --unique_ttl (how long the key is held, e.g. 1h)");
    }
    spec->set_unique_key(absl::GetFlag(FLAGS_unique_key));
    *spec->mutable_unique_ttl() = taskgrid::ToProto(absl::GetFlag(FLAGS_unique_ttl));
    if (absl::GetFlag(FLAGS_unique_keep)) spec->set_unique_release(v1::UNIQUE_RELEASE_AT_TTL);
    spec->set_unique_refuse(absl::GetFlag(FLAGS_unique_refuse));
  }
  if (const std::string u = absl::GetFlag(FLAGS_merge_update); !u.empty()) {
    if (u != "always" && u != "once") {
      return UsageError(absl::StrCat("--merge_update must be always or once, not \"", u, "\""));
    }
    spec->set_merge_update(u == "always" ? v1::MERGE_UPDATE_ALWAYS : v1::MERGE_UPDATE_ONCE);
  }
  if (absl::GetFlag(FLAGS_replicas) < 0) return UsageError("--replicas is negative");
  v1::Replicas replicas;
  replicas.set_count(absl::GetFlag(FLAGS_replicas));
  for (const std::string& a : taskgrid::ctl::ParseList(absl::GetFlag(FLAGS_replica_agents))) {
    replicas.add_agent_ids(a);
  }
  if (set.count("replica_agents") && replicas.agent_ids().empty()) {
    return UsageError("--replica_agents names no agent: --replica_agents=a1,a2,...");
  }
  if (set.count("success")) {
    if (absl::Status s = taskgrid::ctl::ParseSuccess(absl::GetFlag(FLAGS_success), &replicas);
        !s.ok()) {
      return UsageError(std::string(s.message()));
    }
  }
  replicas.set_gang(absl::GetFlag(FLAGS_gang));
  if (set.count("gang_wait")) {
    if (!replicas.gang()) return UsageError("--gang_wait needs --gang");
    *replicas.mutable_gang_wait() = taskgrid::ToProto(absl::GetFlag(FLAGS_gang_wait));
  }
  if (replicas.count() > 0 || !replicas.agent_ids().empty()) {
    *spec->mutable_replicas() = std::move(replicas);
  } else if (set.count("success") || replicas.gang()) {
    return UsageError(absl::StrCat(set.count("success") ? "--success" : "--gang",
                                   " needs --replicas=N or --replica_agents=a1,a2,..."));
  }
  if (absl::GetFlag(FLAGS_slots) < 0) return UsageError("--slots is negative");
  if (absl::GetFlag(FLAGS_slots) > 0) {
    spec->mutable_placement()->set_slots(absl::GetFlag(FLAGS_slots));
  }
  if (set.count("resources")) {
    absl::StatusOr<taskgrid::Resources> need =
        taskgrid::ParseResourceList(absl::GetFlag(FLAGS_resources));
    if (!need.ok()) return UsageError(absl::StrCat("--resources: ", need.status().message()));
    taskgrid::ToResourceMap(*need, spec->mutable_placement()->mutable_resources());
  }
  if (set.count("not_before")) {
    absl::StatusOr<absl::Time> when =
        taskgrid::ctl::ParseWhen(absl::GetFlag(FLAGS_not_before), absl::Now());
    if (!when.ok()) return UsageError(absl::StrCat("--not_before: ", when.status().message()));
    taskgrid::SetTimestamp(*when, spec->mutable_not_before());
  }
  if (set.count("payload") && set.count("payload_file")) {
    return UsageError("give --payload or --payload_file, not both");
  }
  if (set.count("payload_file")) {
    absl::StatusOr<std::string> payload = ReadInput(absl::GetFlag(FLAGS_payload_file));
    if (!payload.ok()) {
      return UsageError(absl::StrCat("--payload_file: ", payload.status().message()));
    }
    spec->set_payload(*payload);
  } else {
    spec->set_payload(absl::GetFlag(FLAGS_payload));
  }
  const std::pair<const char*, absl::Duration> durations[] = {
      {"step_timeout", absl::GetFlag(FLAGS_step_timeout)},
      {"attempt_timeout", absl::GetFlag(FLAGS_attempt_timeout)},
      {"ack_timeout", absl::GetFlag(FLAGS_ack_timeout)},
      {"schedule_timeout", absl::GetFlag(FLAGS_schedule_timeout)}};
  for (const auto& [f, d] : durations) {
    if (d < absl::ZeroDuration() || d == absl::InfiniteDuration()) {
      return UsageError(absl::StrCat("--", f, " must be a positive duration like 90s"));
    }
  }
  // Only what was given is set: an empty sub-message would make the spec
  // differ from the same task submitted from JSON.
  if (absl::GetFlag(FLAGS_step_timeout) > absl::ZeroDuration()) {
    *step->mutable_timeout() = taskgrid::ToProto(absl::GetFlag(FLAGS_step_timeout));
  }
  if (absl::GetFlag(FLAGS_attempt_timeout) > absl::ZeroDuration()) {
    *spec->mutable_attempt_timeout() = taskgrid::ToProto(absl::GetFlag(FLAGS_attempt_timeout));
  }
  if (absl::GetFlag(FLAGS_ack_timeout) > absl::ZeroDuration()) {
    *spec->mutable_ack_timeout() = taskgrid::ToProto(absl::GetFlag(FLAGS_ack_timeout));
  }
  if (absl::GetFlag(FLAGS_schedule_timeout) > absl::ZeroDuration()) {
    *spec->mutable_schedule_timeout() = taskgrid::ToProto(absl::GetFlag(FLAGS_schedule_timeout));
  }
  auto labels = taskgrid::ctl::ParseKeyValues("labels", absl::GetFlag(FLAGS_labels));
  if (!labels.ok()) return UsageError(std::string(labels.status().message()));
  for (const auto& [k, v] : *labels) (*spec->mutable_placement()->mutable_required_labels())[k] = v;
  auto own = taskgrid::ctl::ParseKeyValues("task_labels", absl::GetFlag(FLAGS_task_labels));
  if (!own.ok()) return UsageError(std::string(own.status().message()));
  for (const auto& [k, v] : *own) (*spec->mutable_labels())[k] = v;
  for (const std::string& a : taskgrid::ctl::ParseList(absl::GetFlag(FLAGS_agents))) {
    spec->mutable_placement()->add_agent_ids(a);
  }
  return kExitOk;
}

// --state=S,... (any case) into `out`; a usage error names an unknown one.
int ParseStates(google::protobuf::RepeatedField<int>* out) {
  for (const std::string& name : taskgrid::ctl::ParseList(absl::GetFlag(FLAGS_state))) {
    v1::TaskState s;
    if (!taskgrid::core::ParseStateName(name, &s)) {
      return UsageError(absl::StrCat("--state: unknown state \"", name, "\""),
                        taskgrid::ctl::StatesLine());
    }
    out->Add(s);
  }
  return kExitOk;
}

int BuildList(v1::ListTasksRequest* req) {
  req->set_queue(absl::GetFlag(FLAGS_queue));
  req->set_job_id(absl::GetFlag(FLAGS_job));
  req->set_id_prefix(absl::GetFlag(FLAGS_id_prefix));
  req->set_newest_first(absl::GetFlag(FLAGS_newest_first));
  auto labels = taskgrid::ctl::ParseKeyValues("task_labels", absl::GetFlag(FLAGS_task_labels));
  if (!labels.ok()) return UsageError(std::string(labels.status().message()));
  for (const auto& [k, v] : *labels) (*req->mutable_labels())[k] = v;
  if (int rc = ParseStates(req->mutable_states()); rc != kExitOk) return rc;
  if (absl::GetFlag(FLAGS_page_size) < 0) return UsageError("--page_size is negative");
  req->set_page_size(absl::GetFlag(FLAGS_page_size));
  req->set_page_token(absl::GetFlag(FLAGS_page_token));
  return kExitOk;
}

int BuildWatch(const std::set<std::string>& set, taskgrid::ctl::WatchOptions* opts) {
  v1::WatchTasksRequest* req = &opts->request;
  std::vector<std::string> filters;
  req->set_queue(absl::GetFlag(FLAGS_queue));
  if (!req->queue().empty()) filters.push_back(absl::StrCat("--queue=", req->queue()));
  const std::vector<std::string> ids = taskgrid::ctl::ParseList(absl::GetFlag(FLAGS_id));
  for (const std::string& id : ids) req->add_task_ids(id);
  if (!ids.empty()) filters.push_back(absl::StrCat("--id=", absl::StrJoin(ids, ",")));
  std::vector<std::string> states;
  if (int rc = ParseStates(req->mutable_states()); rc != kExitOk) return rc;
  for (int s : req->states())
    states.push_back(taskgrid::core::StateName(static_cast<v1::TaskState>(s)));
  if (!states.empty()) filters.push_back(absl::StrCat("--state=", absl::StrJoin(states, ",")));
  req->set_job_id(absl::GetFlag(FLAGS_job));
  if (!req->job_id().empty()) filters.push_back(absl::StrCat("--job=", req->job_id()));
  if (set.count("json")) filters.push_back("--json");
  if (set.count("after")) {
    if (absl::GetFlag(FLAGS_after) < 0) return UsageError("--after is negative");
    req->set_after_revision(absl::GetFlag(FLAGS_after));
  }
  if (absl::GetFlag(FLAGS_count) < 0) return UsageError("--count is negative");
  opts->count = absl::GetFlag(FLAGS_count);
  opts->follow = absl::GetFlag(FLAGS_follow);
  opts->filter_flags = absl::StrJoin(filters, " ");
  return kExitOk;
}

// Builds the request of `job submit`: the file named by the one word in
// `words` (or --file), with --id overriding its job_id.
int BuildJobSubmit(const std::vector<std::string>& words, const std::set<std::string>& set,
                   const std::string& hint, v1::SubmitJobRequest* req) {
  std::string file;
  if (set.count("file")) {
    if (!words.empty()) return UsageError("give the job file once: FILE or --file=FILE", hint);
    file = absl::GetFlag(FLAGS_file);
  } else if (words.size() == 1) {
    file = words[0];
  } else {
    return UsageError(words.empty() ? "job submit needs a FILE ('-' = stdin)"
                                    : absl::StrCat("unexpected \"", words[1], "\" after the FILE"),
                      hint);
  }
  if (file.empty()) return UsageError("the job FILE is empty", hint);
  absl::StatusOr<std::string> text = ReadInput(file);
  if (!text.ok()) return UsageError(std::string(text.status().message()));
  absl::StatusOr<v1::SubmitJobRequest> parsed =
      taskgrid::ctl::ParseSubmitJobJson(*text, file == "-" ? "<stdin>" : file);
  if (!parsed.ok()) {
    return UsageError(std::string(parsed.status().message()),
                      "Nothing was submitted. See 'taskgridctl help job submit' for the format.");
  }
  *req = std::move(*parsed);
  if (set.count("id")) {
    const std::string id = absl::GetFlag(FLAGS_id);
    if (id.empty()) return UsageError("--id is empty", hint);
    // Tasks that name the file's job follow it to the new id.
    for (v1::TaskSpec& spec : *req->mutable_tasks()) {
      if (!spec.job_id().empty() && spec.job_id() == req->job_id()) spec.set_job_id(id);
    }
    req->set_job_id(id);
  }
  return kExitOk;
}

int BuildJobList(v1::ListJobsRequest* req) {
  for (const std::string& name : taskgrid::ctl::ParseList(absl::GetFlag(FLAGS_state))) {
    v1::JobState s;
    if (!taskgrid::core::ParseJobStateName(name, &s)) {
      return UsageError(absl::StrCat("--state: unknown job state \"", name, "\""),
                        taskgrid::ctl::JobStatesLine());
    }
    req->add_states(s);
  }
  if (absl::GetFlag(FLAGS_page_size) < 0) return UsageError("--page_size is negative");
  req->set_page_size(absl::GetFlag(FLAGS_page_size));
  req->set_page_token(absl::GetFlag(FLAGS_page_token));
  return kExitOk;
}

// Builds the request of `schedule create ID ...`: the trigger from --cron or
// --every, the task template from the flags of submit (or -f FILE holding
// one TaskSpec). `words` are the positional words after "create".
int BuildScheduleCreate(const std::vector<std::string>& words, bool has_dashdash,
                        const std::vector<std::string>& argv, const std::set<std::string>& set,
                        const std::string& hint, v1::CreateScheduleRequest* req) {
  if (words.empty() || words[0].empty()) return UsageError("schedule create needs an ID", hint);
  v1::Schedule* s = req->mutable_schedule();
  s->set_id(words[0]);
  const bool cron = set.count("cron") > 0;
  const bool every = set.count("every") > 0;
  if (cron == every) {
    return UsageError(cron ? "give --cron or --every, not both"
                           : "schedule create needs --cron=EXPR or --every=DURATION",
                      hint);
  }
  if (cron) {
    s->set_cron(absl::GetFlag(FLAGS_cron));
  } else {
    const absl::Duration d = absl::GetFlag(FLAGS_every);
    if (d == absl::InfiniteDuration()) return UsageError("--every must be a duration like 30s");
    // Checked by the scheduler (at least 1s, whole seconds).
    *s->mutable_interval() = taskgrid::ToProto(d);
  }
  if (set.count("tz")) {
    if (!cron) return UsageError("--tz applies to --cron", hint);
    s->set_time_zone(absl::GetFlag(FLAGS_tz));
  }
  if (const std::string m = absl::GetFlag(FLAGS_misfire); !m.empty()) {
    if (m != "skip" && m != "run_once" && m != "catch_up") {
      return UsageError(
          absl::StrCat("--misfire must be catch_up, skip or run_once, not \"", m, "\""), hint);
    }
    s->set_misfire_policy(m == "skip"       ? v1::MISFIRE_POLICY_SKIP
                          : m == "run_once" ? v1::MISFIRE_POLICY_RUN_ONCE
                                            : v1::MISFIRE_POLICY_CATCH_UP);
  }
  s->set_paused(absl::GetFlag(FLAGS_paused));
  v1::SubmitTasksRequest task;
  const std::vector<std::string> rest(words.begin() + 1, words.end());
  if (int rc = BuildSubmit(rest, has_dashdash, argv, set, &task,
                           {"cron", "every", "tz", "misfire", "paused"});
      rc != kExitOk) {
    return rc;
  }
  if (task.tasks_size() != 1) {
    return UsageError(absl::StrCat("the file holds ", task.tasks_size(),
                                   " tasks; a schedule's template is one TaskSpec"),
                      hint);
  }
  *s->mutable_task_template() = std::move(*task.mutable_tasks(0));
  return kExitOk;
}

absl::Duration WaitTimeout() { return absl::GetFlag(FLAGS_wait_timeout); }

// The claim `board extend|complete|abandon|trash ID ATTEMPT --owner=O` names.
int BuildClaimRef(const std::string& name, const std::vector<std::string>& args,
                  const std::string& hint, v1::ClaimRef* ref) {
  int32_t attempt = 0;
  if (args.size() != 2 || args[0].empty() || !absl::SimpleAtoi(args[1], &attempt) || attempt < 1) {
    return UsageError(absl::StrCat(name, " takes a task ID and the claimed ATTEMPT number"), hint);
  }
  if (absl::GetFlag(FLAGS_owner).empty()) return UsageError(name + " needs --owner", hint);
  ref->set_task_id(args[0]);
  ref->set_attempt(attempt);
  ref->set_owner(absl::GetFlag(FLAGS_owner));
  return kExitOk;
}

// The worker's --labels, for board claim and board wait.
int BuildWorkerLabels(google::protobuf::Map<std::string, std::string>* out) {
  auto labels = taskgrid::ctl::ParseKeyValues("labels", absl::GetFlag(FLAGS_labels));
  if (!labels.ok()) return UsageError(std::string(labels.status().message()));
  for (const auto& [k, v] : *labels) (*out)[k] = v;
  return kExitOk;
}

int RunBoard(const std::string& name, const std::vector<std::string>& args,
             taskgrid::ctl::Client& client, const std::string& hint) {
  const absl::Duration lease = absl::GetFlag(FLAGS_lease);
  if (lease < absl::ZeroDuration() || lease == absl::InfiniteDuration()) {
    return UsageError("--lease must be a positive duration like 60s", hint);
  }
  // board claim takes one task id at most; board wait none.
  const size_t operands = name == "board claim" ? 1 : 0;
  if ((name == "board claim" || name == "board wait") && args.size() > operands) {
    return UsageError(absl::StrCat("unexpected \"", args[operands], "\" after ", name), hint);
  }
  if (name == "board claim") {
    v1::ClaimRequest req;
    if (absl::GetFlag(FLAGS_owner).empty()) return UsageError("board claim needs --owner", hint);
    if (!args.empty()) req.set_task_id(args[0]);
    req.set_owner(absl::GetFlag(FLAGS_owner));
    req.set_queue(absl::GetFlag(FLAGS_queue));
    req.set_max(absl::GetFlag(FLAGS_max));
    if (lease > absl::ZeroDuration()) *req.mutable_lease() = taskgrid::ToProto(lease);
    if (int rc = BuildWorkerLabels(req.mutable_labels()); rc != kExitOk) return rc;
    return client.BoardClaim(req);
  }
  if (name == "board wait") {
    v1::WaitForWorkRequest req;
    req.set_queue(absl::GetFlag(FLAGS_queue));
    if (int rc = BuildWorkerLabels(req.mutable_labels()); rc != kExitOk) return rc;
    *req.mutable_timeout() = taskgrid::ToProto(std::min(WaitTimeout(), absl::Hours(1)));
    return client.BoardWait(req);
  }
  if (name == "board restore") {
    if (args.size() != 1 || args[0].empty())
      return UsageError("board restore takes one task ID", hint);
    return client.BoardRestore(args[0]);
  }
  v1::ClaimRef ref;
  if (int rc = BuildClaimRef(name, args, hint, &ref); rc != kExitOk) return rc;
  if (name == "board extend") {
    v1::ExtendClaimRequest req;
    *req.mutable_claim() = ref;
    if (lease > absl::ZeroDuration()) *req.mutable_lease() = taskgrid::ToProto(lease);
    return client.BoardExtend(req);
  }
  if (name == "board complete") {
    v1::CompleteClaimRequest req;
    *req.mutable_claim() = ref;
    v1::TaskResult* r = req.mutable_result();
    const int32_t code = absl::GetFlag(FLAGS_exit_code);
    r->set_outcome(code == 0 ? v1::OUTCOME_SUCCEEDED : v1::OUTCOME_FAILED);
    r->set_exit_code(code);
    r->set_stdout_tail(absl::GetFlag(FLAGS_stdout));
    r->set_error(absl::GetFlag(FLAGS_error));
    return client.BoardComplete(req);
  }
  if (name == "board abandon") {
    v1::AbandonClaimRequest req;
    *req.mutable_claim() = ref;
    req.set_reason(absl::GetFlag(FLAGS_reason));
    return client.BoardAbandon(req);
  }
  v1::TrashClaimRequest req;  // board trash
  *req.mutable_claim() = ref;
  req.set_reason(absl::GetFlag(FLAGS_reason));
  return client.BoardTrash(req);
}

bool ValidWaitTimeout() { return WaitTimeout() > absl::ZeroDuration(); }

int Run(int argc, char** argv) {
  // 1. Split at the first `--`; rewrite -f FILE and -h.
  std::vector<std::string> before;
  std::vector<std::string> after;
  bool has_dashdash = false;
  const std::vector<std::string> raw =
      taskgrid::ctl::LogsShorthands(std::vector<std::string>(argv + 1, argv + argc));
  for (size_t i = 0; i < raw.size(); ++i) {
    const std::string& arg = raw[i];
    if (has_dashdash) {
      after.push_back(arg);
    } else if (arg == "--") {
      has_dashdash = true;
    } else if (arg == "-f") {
      if (i + 1 == raw.size() || raw[i + 1] == "--") {
        return UsageError("-f needs a FILE", "Usage: taskgridctl submit -f FILE");
      }
      before.push_back(absl::StrCat("--file=", raw[++i]));
    } else if (absl::StartsWith(arg, "-f=")) {
      before.push_back(absl::StrCat("--file=", arg.substr(3)));
    } else if (arg == "-h" || arg == "-help" || arg == "--help") {
      before.push_back("--help");
    } else {
      before.push_back(arg);
    }
  }

  // 2. help, in any of its spellings.
  std::vector<std::string> words;  // positional words before `--`, roughly
  for (const std::string& a : before) {
    if (a.empty() || a[0] != '-') words.push_back(a);
  }
  const bool help_flag = std::find(before.begin(), before.end(), "--help") != before.end();
  if (help_flag || (!words.empty() && words[0] == "help")) {
    std::string topic;
    std::string sub;  // of `job`
    if (help_flag && !words.empty()) {
      topic = words[0];
      if (words.size() > 1) sub = words[1];
    }
    if (!help_flag && words.size() > 1) {
      topic = words[1];
      if (words.size() > 2) sub = words[2];
    }
    if (topic.empty()) {
      std::cout << UsageText();
      return kExitOk;
    }
    if (topic == "reference") {
      std::cout << taskgrid::ctl::ReferenceMarkdown();
      return kExitOk;
    }
    if (const std::string group = GroupUsageText(topic); !group.empty()) {
      if (sub.empty()) {
        std::cout << group;
        return kExitOk;
      }
      topic = absl::StrCat(topic, " ", sub);
    }
    const Command* c = FindCommand(topic);
    if (c == nullptr) return UsageError(absl::StrCat("unknown command \"", topic, "\""));
    std::cout << CommandHelp(*c);
    return kExitOk;
  }

  // 3. Flags: checked, then parsed by Abseil (which also serves --helpfull).
  std::set<std::string> set;
  std::string error;
  if (!taskgrid::ctl::CheckFlags(before, &set, &error)) return UsageError(error);
  std::vector<char*> flag_argv = {argv[0]};
  for (std::string& a : before) flag_argv.push_back(a.data());
  std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(flag_argv.size()), flag_argv.data());
  if (positional.size() < 2) {
    std::cerr << UsageText();
    return kExitUsage;
  }
  std::string name = positional[1];
  std::vector<std::string> args(positional.begin() + 2, positional.end());
  if (name == "job" || name == "board" || name == "queue" || name == "schedule") {
    // Two words name the command: job submit, board claim, queue pause, ...
    const char* group = name == "job"     ? kJobCommands
                        : name == "board" ? kBoardCommands
                        : name == "queue" ? kQueueCommands
                                          : kScheduleCommands;
    if (args.empty()) return UsageError(name + " needs a command", group);
    name = absl::StrCat(name, " ", args[0]);
    args.erase(args.begin());
    if (FindCommand(name) == nullptr) {
      return UsageError(absl::StrCat("unknown command \"", name, "\""), group);
    }
  }
  const Command* command = FindCommand(name);
  if (command == nullptr) return UsageError(absl::StrCat("unknown command \"", name, "\""));
  const std::string command_hint = absl::StrCat("Usage: taskgridctl ", command->synopsis);
  for (const std::string& f : set) {
    if (f == "addr" || f == "json" || f == "timeout" || f == "tls_ca" || f == "tls_cert" ||
        f == "tls_key" || f == "token_file") {
      continue;
    }
    if (std::find(command->flags.begin(), command->flags.end(), f) == command->flags.end()) {
      return UsageError(absl::StrCat("--", f, " does not apply to ", name), command_hint);
    }
  }
  if (name != "submit" && name != "schedule create" && has_dashdash) {
    return UsageError(absl::StrCat(name, " takes no arguments after --"), command_hint);
  }
  const absl::Duration timeout = absl::GetFlag(FLAGS_timeout);
  if (timeout <= absl::ZeroDuration() || timeout == absl::InfiniteDuration()) {
    return UsageError("--timeout must be a positive duration like 30s");
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> creds = ResolveCredentials();
  if (!creds.ok()) {
    std::cerr << "error: " << creds.status().message() << "\n";
    return kExitUsage;
  }
  if (auto list = taskgrid::SchedulerAddresses::Parse(ResolveAddr()); !list.ok()) {
    return UsageError(absl::StrCat("--addr: ", list.status().message()));
  }
  const taskgrid::TlsFiles tls = ResolveTlsFiles();
  taskgrid::ctl::Client client({ResolveAddr(),
                                absl::GetFlag(FLAGS_json),
                                absl::GetFlag(FLAGS_timeout),
                                *std::move(creds),
                                {tls.ca, tls.cert, tls.key}});

  // 4. The command.
  if (set.count("wait_timeout") && !ValidWaitTimeout()) {
    return UsageError("--wait_timeout must be a positive duration like 10m", command_hint);
  }
  if (name == "submit") {
    if (set.count("wait_timeout") && !absl::GetFlag(FLAGS_wait)) {
      return UsageError("--wait_timeout needs --wait", command_hint);
    }
    v1::SubmitTasksRequest req;
    if (int rc = BuildSubmit(args, has_dashdash, after, set, &req); rc != kExitOk) return rc;
    taskgrid::ctl::GiveIds(&req);
    if (absl::GetFlag(FLAGS_wait)) return client.SubmitAndWait(req, WaitTimeout());
    return client.Submit(req);
  }
  if (name == "job submit") {
    if (set.count("wait_timeout") && !absl::GetFlag(FLAGS_wait)) {
      return UsageError("--wait_timeout needs --wait", command_hint);
    }
    v1::SubmitJobRequest req;
    if (int rc = BuildJobSubmit(args, set, command_hint, &req); rc != kExitOk) return rc;
    taskgrid::ctl::GiveIds(&req);
    return client.SubmitJob(req, absl::GetFlag(FLAGS_wait), WaitTimeout());
  }
  if (name == "job list") {
    if (!args.empty()) {
      return UsageError(absl::StrCat("unexpected \"", args[0], "\" after job list"), command_hint);
    }
    v1::ListJobsRequest req;
    if (int rc = BuildJobList(&req); rc != kExitOk) return rc;
    return client.ListJobs(req, absl::GetFlag(FLAGS_all));
  }
  if (name == "job get" || name == "job cancel" || name == "job retry" || name == "job delete") {
    if (args.size() != 1 || args[0].empty()) {
      return UsageError(absl::StrCat(name, args.empty() ? " needs a job ID" : " takes one job ID"),
                        command_hint);
    }
    if (name == "job get") return client.GetJob(args[0]);
    if (name == "job delete") return client.DeleteJob(args[0]);
    return client.ActOnJob(
        name == "job cancel" ? taskgrid::ctl::JobAction::kCancel : taskgrid::ctl::JobAction::kRetry,
        args[0]);
  }
  if (absl::StartsWith(name, "board ")) return RunBoard(name, args, client, command_hint);
  if (absl::StartsWith(name, "queue ")) {
    if (args.size() != 1 || args[0].empty()) {
      return UsageError(absl::StrCat(name, args.empty() ? " needs a QUEUE" : " takes one QUEUE"),
                        command_hint);
    }
    if (name == "queue pause") return client.PauseQueue(args[0], /*paused=*/true);
    if (name == "queue resume") return client.PauseQueue(args[0], /*paused=*/false);
    if (name == "queue retention") {
      v1::SetQueueRetentionRequest req;
      req.set_queue(args[0]);
      if (set.count("retention"))
        *req.mutable_retention() = taskgrid::ToProto(absl::GetFlag(FLAGS_retention));
      if (set.count("failed_retention")) {
        *req.mutable_failed_retention() = taskgrid::ToProto(absl::GetFlag(FLAGS_failed_retention));
      }
      return client.SetQueueRetention(req);
    }
    if (name == "queue weight") {
      v1::SetQueueWeightRequest req;
      req.set_queue(args[0]);
      if (set.count("weight")) req.set_weight(absl::GetFlag(FLAGS_weight));
      return client.SetQueueWeight(req);
    }
    v1::SetQueueLimitsRequest req;
    req.set_queue(args[0]);
    req.set_max_concurrency(absl::GetFlag(FLAGS_max_concurrency));
    req.set_rate_per_second(absl::GetFlag(FLAGS_rate));
    req.set_burst(absl::GetFlag(FLAGS_burst));
    absl::StatusOr<taskgrid::Resources> quota =
        taskgrid::ParseResourceList(absl::GetFlag(FLAGS_quota));
    if (!quota.ok()) return UsageError(absl::StrCat("--quota: ", quota.status().message()));
    taskgrid::ToResourceMap(*quota, req.mutable_quota());
    return client.SetQueueLimits(req);
  }
  const bool bulk = name == "cancel" || name == "retry" || name == "delete";
  if (bulk && args.empty() && !set.count("merge_key") && (set.count("queue") || set.count("job"))) {
    // By filter: every page, one call each.
    v1::BulkTasksRequest req;
    req.set_queue(absl::GetFlag(FLAGS_queue));
    req.set_job_id(absl::GetFlag(FLAGS_job));
    if (int rc = ParseStates(req.mutable_states()); rc != kExitOk) return rc;
    req.set_limit(absl::GetFlag(FLAGS_limit));
    using taskgrid::ctl::BulkChange;
    return client.Bulk(name == "cancel"  ? BulkChange::kCancel
                       : name == "retry" ? BulkChange::kRetry
                                         : BulkChange::kDelete,
                       req);
  }
  if (bulk && (set.count("state") || set.count("limit"))) {
    return UsageError(absl::StrCat("--state and --limit select tasks by filter: ", name,
                                   " --queue=Q or --job=JOB, without an ID"),
                      command_hint);
  }
  if (name == "schedule create") {
    v1::CreateScheduleRequest req;
    if (int rc = BuildScheduleCreate(args, has_dashdash, after, set, command_hint, &req);
        rc != kExitOk) {
      return rc;
    }
    return client.CreateSchedule(req);
  }
  if (name == "schedule list") {
    if (!args.empty()) {
      return UsageError(absl::StrCat("unexpected \"", args[0], "\" after schedule list"),
                        command_hint);
    }
    if (absl::GetFlag(FLAGS_page_size) < 0) return UsageError("--page_size is negative");
    v1::ListSchedulesRequest req;
    req.set_page_size(absl::GetFlag(FLAGS_page_size));
    req.set_page_token(absl::GetFlag(FLAGS_page_token));
    return client.ListSchedules(req, absl::GetFlag(FLAGS_all));
  }
  if (absl::StartsWith(name, "schedule ")) {
    if (args.size() != 1 || args[0].empty()) {
      return UsageError(
          absl::StrCat(name, args.empty() ? " needs a schedule ID" : " takes one schedule ID"),
          command_hint);
    }
    if (name == "schedule get") return client.GetSchedule(args[0]);
    using taskgrid::ctl::ScheduleAction;
    return client.ActOnSchedule(name == "schedule pause"    ? ScheduleAction::kPause
                                : name == "schedule resume" ? ScheduleAction::kResume
                                                            : ScheduleAction::kDelete,
                                args[0]);
  }
  if (name == "delete") {
    if (set.count("merge_key")) {
      if (!args.empty() || set.count("job") || absl::GetFlag(FLAGS_merge_key).empty()) {
        return UsageError("delete --merge_key=KEY takes --queue=Q only, no ID", command_hint);
      }
      return client.DeleteByMergeKey(absl::GetFlag(FLAGS_queue), absl::GetFlag(FLAGS_merge_key));
    }
    if (args.empty()) return UsageError("delete needs a task ID (or --queue=Q)", command_hint);
    if (set.count("queue") || set.count("job")) {
      return UsageError("delete takes task IDs or --queue/--job, not both", command_hint);
    }
    for (const std::string& id : args) {
      if (id.empty()) return UsageError("delete: empty task ID", command_hint);
    }
    return client.Delete(args);
  }
  if (name == "wait") {
    if (args.empty()) return UsageError("wait needs a task ID", command_hint);
    for (const std::string& id : args) {
      if (id.empty()) return UsageError("wait: empty task ID", command_hint);
    }
    return client.Wait(args, WaitTimeout());
  }
  if (name == "watch") {
    if (!args.empty()) {
      return UsageError(absl::StrCat("unexpected \"", args[0], "\" after watch"), command_hint);
    }
    taskgrid::ctl::WatchOptions opts;
    if (int rc = BuildWatch(set, &opts); rc != kExitOk) return rc;
    return client.Watch(opts);
  }
  if (name == "list" || name == "stats" || name == "agents" || name == "cluster") {
    if (!args.empty()) {
      return UsageError(absl::StrCat("unexpected \"", args[0], "\" after ", name), command_hint);
    }
    if (name == "stats") return client.Stats(absl::GetFlag(FLAGS_queue));
    if (name == "agents") return client.Agents();
    if (name == "cluster") return client.ClusterStats();
    v1::ListTasksRequest req;
    if (int rc = BuildList(&req); rc != kExitOk) return rc;
    return client.List(req, absl::GetFlag(FLAGS_all));
  }
  // The commands on one task, and drain and undrain (on one agent).
  const bool on_agent = name == "drain" || name == "undrain";
  if (args.size() != 1 || args[0].empty()) {
    return UsageError(
        args.empty() ? absl::StrCat(name, on_agent ? " needs an agent ID" : " needs a task ID")
                     : absl::StrCat(name, on_agent ? " takes one agent ID" : " takes one task ID"),
        command_hint);
  }
  if (name == "drain") return client.Drain(args[0]);
  if (name == "undrain") return client.Undrain(args[0]);
  if ((name == "cancel" || name == "retry") && (set.count("queue") || set.count("job"))) {
    return UsageError(absl::StrCat(name, " takes a task ID or --queue/--job, not both"),
                      command_hint);
  }
  if (name == "get") return client.Get(args[0]);
  if (name == "logs") {
    v1::StreamTaskOutputRequest req;
    req.set_id(args[0]);
    req.set_follow(absl::GetFlag(FLAGS_follow));
    auto stream = taskgrid::ctl::ParseOutputStream(absl::GetFlag(FLAGS_stream));
    if (!stream.ok()) return UsageError(std::string(stream.status().message()), command_hint);
    req.set_stream(*stream);
    if (set.count("wait_timeout") && !req.follow()) {
      return UsageError("--wait_timeout needs --follow (-f)", command_hint);
    }
    return client.Logs(req, WaitTimeout());
  }
  using taskgrid::ctl::Action;
  const Action action = name == "cancel"  ? Action::kCancel
                        : name == "retry" ? Action::kRetry
                        : name == "reset" ? Action::kReset
                        : name == "pause" ? Action::kPause
                                          : Action::kResume;
  return client.Act(action, args[0]);
}

}  // namespace

int main(int argc, char** argv) {
  // Abseil's --helpfull prints "taskgridctl: " before the message itself.
  absl::SetProgramUsageMessage(absl::StripPrefix(UsageText(), "taskgridctl: "));
  taskgrid::SetVersionAndFileNames();
  return Run(argc, argv);
}
