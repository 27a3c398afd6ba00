#include "tools/ctl/output.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/http_rules.h"
#include "common/proto_time.h"
#include "google/protobuf/util/json_util.h"
#include "scheduler/core/state_machine.h"

namespace taskgrid::ctl {

namespace {

// "cpu=2/8,memory=4GiB/32GiB": held / offered per name, sorted by name;
// a name held but no longer offered (an agent back with less) shows /0.
std::string FormatUsedOfTotal(const google::protobuf::Map<std::string, std::string>& used,
                              const google::protobuf::Map<std::string, std::string>& total) {
  std::map<std::string, std::pair<std::string, std::string>> rows;
  for (const auto& [k, v] : total) rows[k] = {"0", v};
  for (const auto& [k, v] : used) {
    auto& row = rows[k];
    row.first = v;
    if (row.second.empty()) row.second = "0";
  }
  std::vector<std::string> parts;
  for (const auto& [k, row] : rows)
    parts.push_back(absl::StrCat(k, "=", row.first, "/", row.second));
  return absl::StrJoin(parts, ",");
}

// Code points, not bytes, so a UTF-8 cell does not throw the columns off.
size_t DisplayWidth(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) {
    if ((c & 0xC0) != 0x80) ++n;
  }
  return n;
}

std::string OneLine(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  }
  return s;
}

// The argument as a shell would need it, for display only.
std::string QuoteArg(const std::string& arg) {
  if (!arg.empty() && std::all_of(arg.begin(), arg.end(), [](char c) {
        return absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
               absl::StrContains("-_./=:,+@%", c);
      })) {
    return arg;
  }
  std::string out = "'";
  for (char c : arg) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string StepText(const v1::Step& step) {
  std::string out;
  if (step.has_exec()) {
    std::vector<std::string> words;
    for (const std::string& a : step.exec().argv()) words.push_back(QuoteArg(a));
    out = absl::StrCat("exec ", absl::StrJoin(words, " "));
    if (!step.exec().cwd().empty()) absl::StrAppend(&out, " (in ", step.exec().cwd(), ")");
  } else if (step.has_builtin()) {
    std::vector<std::string> words = {step.builtin().name()};
    for (const std::string& a : step.builtin().args()) words.push_back(QuoteArg(a));
    out = absl::StrCat("builtin ", absl::StrJoin(words, " "));
  } else if (step.has_http()) {
    // Header values are left out: they often carry credentials.
    const v1::HttpStep& h = step.http();
    out = absl::StrCat("http ", http::MethodOrDefault(h.method()), " ", h.url());
    if (!h.success_codes().empty()) {
      absl::StrAppend(&out, " (success: ", absl::StrJoin(h.success_codes(), ", "), ")");
    }
  } else {
    out = "(empty step)";
  }
  const absl::Duration timeout = FromProto(step.timeout());
  if (timeout > absl::ZeroDuration()) {
    absl::StrAppend(&out, " [timeout ", absl::FormatDuration(timeout), "]");
  }
  return out;
}

// "Label:" padded so the values line up.
void Field(std::string* out, absl::string_view label, absl::string_view value, size_t width = 16) {
  std::string l = label.empty() ? "" : absl::StrCat(label, ":");
  l.resize(std::max<size_t>(l.size(), width), ' ');
  absl::StrAppend(out, l, value, "\n");
}

// Program output, indented, printed as is (it may not even be text).
void Output(std::string* out, absl::string_view label, const std::string& text) {
  if (text.empty()) {
    Field(out, label, "(empty)", 11);
    return;
  }
  absl::StrAppend(out, label, ":\n");
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    absl::StrAppend(out, "    ", line, "\n");
  }
  if (absl::EndsWith(text, "\n")) out->resize(out->size() - 5);  // the split's empty last line
}

// "Stdout", or "Stdout (truncated: 123 earlier bytes cut)".
std::string CutLabel(absl::string_view label, int64_t cut) {
  if (cut <= 0) return std::string(label);
  return absl::StrCat(label, " (truncated: ", cut, " earlier bytes cut)");
}

// The exit code of a result, or "-" when there is none: the attempt never
// ran a step to its end, or the step did not exit normally (-1: a timeout,
// a signal, a step stopped by a cancel).
std::string ExitCodeText(const v1::TaskResult& r) {
  const v1::Outcome o = r.outcome();
  const bool ran = o == v1::OUTCOME_SUCCEEDED || o == v1::OUTCOME_FAILED ||
                   o == v1::OUTCOME_TIMED_OUT || o == v1::OUTCOME_CANCELLED;
  return ran && r.exit_code() >= 0 ? absl::StrCat(r.exit_code()) : "-";
}

std::string OrDash(const std::string& s) { return s.empty() ? "-" : s; }

// A label map as "k=v,k2=v2": a proto map has no order, so sorted to read
// the same each time.
std::string LabelsText(const google::protobuf::Map<std::string, std::string>& map) {
  std::vector<std::string> labels;
  for (const auto& [k, v] : map) labels.push_back(absl::StrCat(k, "=", v));
  std::sort(labels.begin(), labels.end());
  return absl::StrJoin(labels, ",");
}

// "3, success: quorum 2"; "3 (on a1, a2, a3), success: all" when pinned;
// ", gang" after it when they start together.
std::string ReplicasText(const v1::Replicas& r) {
  const int count = r.agent_ids_size() > 0 ? r.agent_ids_size() : r.count();
  std::string out = absl::StrCat(count);
  if (!r.agent_ids().empty()) {
    absl::StrAppend(&out, " (on ", absl::StrJoin(r.agent_ids(), ", "), ")");
  }
  absl::StrAppend(&out, ", success: ");
  switch (r.success()) {
    case v1::SUCCESS_POLICY_UNSPECIFIED:
    case v1::SUCCESS_POLICY_ALL:
      absl::StrAppend(&out, "all");
      break;
    case v1::SUCCESS_POLICY_ANY:
      absl::StrAppend(&out, "any");
      break;
    case v1::SUCCESS_POLICY_QUORUM:
      absl::StrAppend(&out, "quorum ", r.quorum());
      break;
    default:  // a policy newer than this client
      absl::StrAppend(&out, static_cast<int>(r.success()));
      break;
  }
  if (r.gang()) absl::StrAppend(&out, ", gang");
  return out;
}

}  // namespace

Table::Table(std::vector<std::string> header) : header_(std::move(header)) {}

void Table::AddRow(std::vector<std::string> row) {
  row.resize(header_.size());
  for (std::string& cell : row) cell = OneLine(std::move(cell));
  rows_.push_back(std::move(row));
}

std::string Table::Render() const {
  std::vector<size_t> width(header_.size());
  for (size_t i = 0; i < header_.size(); ++i) width[i] = DisplayWidth(header_[i]);
  for (const auto& row : rows_) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], DisplayWidth(row[i]));
  }
  std::string out;
  auto render_row = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line.append(width[i] - DisplayWidth(row[i]) + 2, ' ');
    }
    // A last column that is empty leaves padding behind; drop it.
    line.erase(line.find_last_not_of(' ') + 1);
    absl::StrAppend(&out, line, "\n");
  };
  render_row(header_);
  for (const auto& row : rows_) render_row(row);
  return out;
}

namespace {

std::string PrintJson(const google::protobuf::Message& m, bool whitespace) {
  google::protobuf::util::JsonPrintOptions opts;
  opts.preserve_proto_field_names = true;
  opts.always_print_primitive_fields = true;
  opts.add_whitespace = whitespace;
  std::string out;
  // Printing a valid message cannot fail.
  (void)google::protobuf::util::MessageToJsonString(m, &out, opts);
  if (!absl::EndsWith(out, "\n")) out += "\n";
  return out;
}

}  // namespace

std::string ToJson(const google::protobuf::Message& m) { return PrintJson(m, true); }

std::string ToJsonLine(const google::protobuf::Message& m) { return PrintJson(m, false); }

std::string FormatTime(const google::protobuf::Timestamp& ts) {
  const absl::Time t = FromProto(ts);
  if (t == absl::InfinitePast()) return "-";
  return absl::FormatTime(absl::RFC3339_sec, t, absl::LocalTimeZone());
}

std::string OutcomeName(v1::Outcome o) {
  if (o == v1::OUTCOME_UNSPECIFIED) return "-";
  std::string name = v1::Outcome_Name(o);
  if (absl::StartsWith(name, "OUTCOME_")) name = name.substr(8);
  return name.empty() ? absl::StrCat(static_cast<int>(o)) : name;
}

std::string AttemptsText(const v1::Task& t) {
  if (t.max_attempts() > 0) return absl::StrCat(t.attempts_used(), "/", t.max_attempts());
  return absl::StrCat(t.attempts_used());
}

std::string TaskStateText(const v1::Task& t) {
  // A pause of a task on an agent takes effect when the agent confirms the
  // stop; until then the task is still RUNNING (or DISPATCHED) in the table.
  if (t.pause_requested() &&
      (t.state() == v1::TASK_STATE_DISPATCHED || t.state() == v1::TASK_STATE_RUNNING)) {
    return "PAUSING";
  }
  return core::StateName(t.state());
}

std::string Shorten(const std::string& s, size_t max) {
  if (DisplayWidth(s) <= max) return s;
  size_t points = 0;
  size_t i = 0;
  const size_t keep = max > 3 ? max - 3 : 0;
  for (; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80 && points++ == keep) break;
  }
  return s.substr(0, i) + "...";
}

std::string FormatEvent(const v1::TaskEvent& ev) {
  const std::string from =
      ev.from_state() == v1::TASK_STATE_UNSPECIFIED ? "-" : core::StateName(ev.from_state());
  std::string out = absl::StrCat(ev.revision(), "  ", FormatTime(ev.time()), "  ", ev.task_id(),
                                 "  ", from, " -> ", core::StateName(ev.to_state()), "  attempt ",
                                 ev.attempt(), "  agent ", OrDash(ev.agent_id()));
  if (!ev.reason().empty()) absl::StrAppend(&out, "  ", OneLine(ev.reason()));
  return out;
}

std::string FormatWaitLine(const v1::Task& t, bool done) {
  std::string out = absl::StrCat(t.spec().id(), " ", core::StateName(t.state()));
  if (done && t.state() != v1::TASK_STATE_SUCCEEDED && !t.reason().empty()) {
    absl::StrAppend(&out, "  ", OneLine(t.reason()));
  }
  return out;
}

std::string FormatSubmitted(const v1::SubmitTasksResponse& resp) {
  Table table({"ID", "QUEUE", "STATE"});
  for (const v1::Task& t : resp.tasks()) {
    table.AddRow({t.spec().id(), t.spec().queue(), core::StateName(t.state())});
  }
  return table.Render();
}

std::string FormatTaskList(const std::vector<v1::Task>& tasks) {
  Table table({"ID", "QUEUE", "STATE", "ATTEMPTS", "AGENT", "PRIO", "UPDATED", "REASON"});
  for (const v1::Task& t : tasks) {
    table.AddRow({t.spec().id(), t.spec().queue(), TaskStateText(t), AttemptsText(t),
                  OrDash(t.agent_id()), absl::StrCat(t.spec().priority()),
                  FormatTime(t.update_time()), Shorten(OneLine(t.reason()), 50)});
  }
  return table.Render();
}

std::string QueueControlsText(const v1::QueueSettings& s) {
  std::vector<std::string> parts;
  if (s.paused()) parts.push_back("paused");
  if (s.max_concurrency() > 0) parts.push_back(absl::StrCat(s.max_concurrency(), " at once"));
  if (s.rate_per_second() > 0) {
    parts.push_back(s.burst() > 0 ? absl::StrCat(s.rate_per_second(), "/s burst ", s.burst())
                                  : absl::StrCat(s.rate_per_second(), "/s"));
  }
  auto kept = [](const google::protobuf::Duration& d) {
    const absl::Duration keep = FromProto(d);
    return keep == absl::ZeroDuration() ? std::string("forever") : absl::FormatDuration(keep);
  };
  if (s.has_weight()) parts.push_back(absl::StrCat("weight ", s.weight()));
  if (s.has_retention()) parts.push_back(absl::StrCat("keeps ", kept(s.retention())));
  if (s.has_failed_retention()) {
    parts.push_back(absl::StrCat("keeps failed ", kept(s.failed_retention())));
  }
  return absl::StrJoin(parts, ", ");
}

std::string FormatBulk(absl::string_view verb, const v1::BulkTasksResponse& resp) {
  std::string out =
      absl::StrCat(verb, " ", resp.ids_size(), resp.ids_size() == 1 ? " task" : " tasks", "\n");
  if (resp.skipped() > 0) {
    absl::StrAppend(&out, "skipped ", resp.skipped(), ": ", resp.skipped_reason(), "\n");
  }
  return out;
}

std::string FormatStats(const v1::GetQueueStatsResponse& resp) {
  std::vector<v1::TaskState> states;
  for (int s = v1::TaskState_MIN; s <= v1::TaskState_MAX; ++s) {
    if (!v1::TaskState_IsValid(s) || s == v1::TASK_STATE_UNSPECIFIED) continue;
    const std::string name = core::StateName(static_cast<v1::TaskState>(s));
    for (const v1::QueueStats& q : resp.queues()) {
      auto it = q.counts().find(name);
      if (it != q.counts().end() && it->second != 0) {
        states.push_back(static_cast<v1::TaskState>(s));
        break;
      }
    }
  }
  const bool claims = std::any_of(resp.queues().begin(), resp.queues().end(),
                                  [](const v1::QueueStats& q) { return q.claimed() > 0; });
  const bool controls = std::any_of(resp.queues().begin(), resp.queues().end(),
                                    [](const v1::QueueStats& q) { return q.has_settings(); });
  // Queues share by weight: some queue has a fair share.
  const bool shares = std::any_of(resp.queues().begin(), resp.queues().end(),
                                  [](const v1::QueueStats& q) { return q.fair_share() > 0; });
  std::vector<std::string> header = {"QUEUE", "LENGTH", "MAX"};
  for (v1::TaskState s : states) header.push_back(core::StateName(s));
  if (claims) header.push_back("CLAIMED");
  if (shares) header.push_back("SHARE");
  if (controls) header.push_back("CONTROLS");
  Table table(std::move(header));
  for (const v1::QueueStats& q : resp.queues()) {
    std::vector<std::string> row = {
        q.queue(), absl::StrCat(q.length()),
        q.max_length() == 0 ? std::string("-") : absl::StrCat(q.max_length())};
    for (v1::TaskState s : states) {
      auto it = q.counts().find(core::StateName(s));
      row.push_back(absl::StrCat(it == q.counts().end() ? 0 : it->second));
    }
    if (claims) row.push_back(absl::StrCat(q.claimed()));
    if (shares) {
      // Held now, of what its weight gives it: "33% of 50%"; "-" for a
      // queue that neither holds nor is owed anything.
      row.push_back(
          q.share() == 0 && q.fair_share() == 0
              ? std::string("-")
              : absl::StrFormat("%.0f%% of %.0f%%", 100 * q.share(), 100 * q.fair_share()));
    }
    if (controls) {
      std::string c = QueueControlsText(q.settings());
      if (!q.settings().quota().empty()) {
        absl::StrAppend(&c, c.empty() ? "" : ", ", "quota ",
                        FormatUsedOfTotal(q.resources_held(), q.settings().quota()));
      }
      if (q.held()) absl::StrAppend(&c, " (holding)");
      row.push_back(c.empty() ? "-" : c);
    }
    table.AddRow(std::move(row));
  }
  return table.Render();
}

std::string FormatTaskDetail(const v1::Task& t) {
  const v1::TaskSpec& spec = t.spec();
  std::string out;
  Field(&out, "ID", spec.id());
  if (!spec.replica_of().empty()) Field(&out, "Replica of", spec.replica_of());
  Field(&out, "Queue", spec.queue());
  if (!spec.labels().empty()) Field(&out, "Labels", LabelsText(spec.labels()));
  Field(&out, "State", TaskStateText(t));
  // The attempt number goes on across pauses, drains and resets; only some
  // attempts count against max_attempts, so the two are shown apart.
  Field(&out, "Attempt", t.attempt() == 0 ? std::string("-") : absl::StrCat(t.attempt()));
  Field(&out, "Attempts used", absl::StrCat(t.attempts_used(), " / ", t.max_attempts()));
  if (t.has_claim_expire_time()) {
    // A pull worker holds it (BoardService), not an agent.
    Field(&out, "Claimed by",
          absl::StrCat(t.agent_id(), " until ", FormatTime(t.claim_expire_time())));
  } else {
    Field(&out, "Agent", OrDash(t.agent_id()));
  }
  Field(&out, "Priority", absl::StrCat(spec.priority()));
  Field(&out, "Created", FormatTime(t.create_time()));
  Field(&out, "Updated", FormatTime(t.update_time()));
  if (t.state() == v1::TASK_STATE_SCHEDULED) Field(&out, "Next run", FormatTime(t.next_run_time()));
  // A task delivered by merge key fires when its merges say (below).
  if (spec.has_not_before() && !t.has_merged()) {
    Field(&out, "Not before", FormatTime(spec.not_before()));
  }
  if (const absl::Duration d = FromProto(spec.schedule_timeout()); d > absl::ZeroDuration()) {
    // Counted from the submit: a task not started by then ends FAILED.
    Field(&out, "Start by",
          absl::StrCat(FormatTime(ToProto(FromProto(t.create_time()) + d)), " (schedule_timeout ",
                       absl::FormatDuration(d), ")"));
  }
  Field(&out, "Reason", OrDash(t.reason()));
  // Numbered from 0, like TaskResult.step and the agent's error messages.
  for (int i = 0; i < spec.steps_size(); ++i) {
    Field(&out, i == 0 ? "Steps" : "", absl::StrCat("[", i, "] ", StepText(spec.steps(i))));
  }
  if (!spec.payload().empty())
    Field(&out, "Payload", absl::StrCat(spec.payload().size(), " bytes"));
  if (t.has_merged()) {
    int64_t bytes = 0;
    for (const std::string& p : t.merged().payloads()) bytes += static_cast<int64_t>(p.size());
    // The first submit sets the fire time (its not_before, else its submit
    // time); a later submit of merge_update always may move it, one of
    // once never does. Which of them decided shows in where it stands.
    const absl::Time first = FromProto(spec.has_not_before() ? spec.not_before() : t.create_time());
    const std::string decided =
        FromProto(t.merged().fire_time()) != first
            ? "moved by a later submit, merge_update always"
            : absl::StrCat("set by the first submit, merge_update ",
                           spec.merge_update() == v1::MERGE_UPDATE_ONCE ? "once" : "always");
    Field(
        &out, "Merge key",
        absl::StrCat(spec.merge_key(), ": ", t.merged().payloads_size(), " payloads (", bytes,
                     " bytes), fires at ", FormatTime(t.merged().fire_time()), " (", decided, ")"));
  }
  if (spec.has_replicas()) {
    // The task runs nothing itself: where it stands is its replicas' states.
    Field(&out, "Replicas", ReplicasText(spec.replicas()));
    if (!t.replicas().empty()) {
      Table table({"TASK", "STATE", "ATTEMPT", "AGENT", "OUTCOME", "REASON"});
      for (const v1::ReplicaStatus& r : t.replicas()) {
        table.AddRow({r.task_id(), core::StateName(r.state()),
                      r.attempt() == 0 ? std::string("-") : absl::StrCat(r.attempt()),
                      OrDash(r.agent_id()), OutcomeName(r.outcome()),
                      Shorten(OrDash(OneLine(r.reason())), 60)});
      }
      // Indented by two spaces, under the line above.
      for (absl::string_view line : absl::StrSplit(table.Render(), '\n', absl::SkipEmpty())) {
        absl::StrAppend(&out, "  ", line, "\n");
      }
    }
  }

  const v1::TaskResult& r = t.result();
  out += "\n";
  if (r.outcome() == v1::OUTCOME_UNSPECIFIED) {
    Field(&out, "Result", "none yet");
  } else {
    out += "Result:\n";
    std::string body;
    Field(&body, "Outcome", OutcomeName(r.outcome()), 11);
    Field(&body, "Exit code", ExitCodeText(r), 11);
    if (spec.steps_size() > 1) Field(&body, "Step", absl::StrCat(r.step()), 11);
    Field(&body, "Error", OrDash(OneLine(r.error())), 11);
    Output(&body, CutLabel("Stdout", r.stdout_cut_bytes()), r.stdout_tail());
    Output(&body, CutLabel("Stderr", r.stderr_cut_bytes()), r.stderr_tail());
    // Indent the result block by two spaces.
    for (absl::string_view line : absl::StrSplit(body, '\n', absl::SkipEmpty())) {
      absl::StrAppend(&out, "  ", line, "\n");
    }
  }

  out += "\n";
  if (t.attempts().empty()) {
    Field(&out, "Attempts", "none finished");
    return out;
  }
  out += t.attempts_dropped() > 0 ? absl::StrCat("Attempts (the newest ", t.attempts_size(), "; ",
                                                 t.attempts_dropped(), " older not kept):\n")
                                  : "Attempts:\n";
  Table table({"ATTEMPT", "AGENT", "OUTCOME", "EXIT", "STARTED", "FINISHED", "ERROR"});
  for (const v1::Attempt& a : t.attempts()) {
    const v1::TaskResult& ar = a.result();
    std::string outcome = OutcomeName(ar.outcome());
    // Ended by a pause or a drain: does not count against max_attempts.
    if (a.interrupted()) {
      outcome = ar.outcome() == v1::OUTCOME_UNSPECIFIED ? "interrupted"
                                                        : absl::StrCat(outcome, " (interrupted)");
    }
    table.AddRow({absl::StrCat(a.attempt()), OrDash(a.agent_id()), outcome, ExitCodeText(ar),
                  FormatTime(a.start_time()), FormatTime(a.finish_time()),
                  Shorten(OrDash(OneLine(ar.error())), 60)});
  }
  return out + table.Render();
}

namespace {
// "4.2s", "42s", "4m58s", "1h02m": a span for people (negative: 0).
std::string SpanText(absl::Duration d) {
  d = std::max(d, absl::ZeroDuration());
  if (d < absl::Seconds(10)) return absl::StrFormat("%.1fs", absl::ToDoubleSeconds(d));
  const int64_t s = absl::ToInt64Seconds(d);
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, s % 3600 / 60);
}
}  // namespace

std::string FormatAgo(absl::Time then, absl::Time now) {
  if (then == absl::InfinitePast()) return "-";
  return SpanText(now - then) + " ago";
}

std::string AgentNoteText(const v1::Agent& a, absl::Time now) {
  std::string out = a.note();
  if (a.has_grace_end_time()) {
    absl::StrAppend(&out, out.empty() ? "" : "; ", "its tasks move in ",
                    SpanText(FromProto(a.grace_end_time()) - now), " unless it is back");
  }
  return out;
}

std::string FormatAgents(const v1::ListAgentsResponse& resp, absl::Time now) {
  Table table({"ID", "STATE", "SLOTS", "RESOURCES", "RUNNING", "LABELS", "LAST HEARTBEAT",
               "VERSION", "NOTE"});
  for (const v1::Agent& a : resp.agents()) {
    table.AddRow({a.id(), core::AgentStateName(a.state()),
                  absl::StrCat(a.slots_used(), "/", a.slots()),
                  OrDash(FormatUsedOfTotal(a.resources_used(), a.resources())),
                  absl::StrCat(a.running_size()), OrDash(LabelsText(a.labels())),
                  FormatAgo(FromProto(a.last_heartbeat_time()), now), OrDash(a.version()),
                  OrDash(AgentNoteText(a, now))});
  }
  return table.Render();
}

std::string FormatClusterStats(const v1::ClusterStats& stats) {
  constexpr size_t kWidth = 17;
  std::string out;
  Field(&out, "Agents active", absl::StrCat(stats.agents_active()), kWidth);
  Field(&out, "Agents draining", absl::StrCat(stats.agents_draining()), kWidth);
  Field(&out, "Agents lost", absl::StrCat(stats.agents_lost()), kWidth);
  Field(&out, "Slots used", absl::StrCat(stats.slots_used(), " / ", stats.slots_total()), kWidth);
  if (!stats.resources_total().empty() || !stats.resources_used().empty()) {
    Field(&out, "Resources used",
          FormatUsedOfTotal(stats.resources_used(), stats.resources_total()), kWidth);
  }
  Field(&out, "Stale messages", absl::StrCat(stats.stale_messages()), kWidth);
  if (stats.has_heartbeat_interval()) {
    // Longer than the scheduler's --heartbeat_interval for a large fleet.
    Field(&out, "Heartbeat every", absl::FormatDuration(FromProto(stats.heartbeat_interval())),
          kWidth);
  }
  // Known states in TaskState order, then any other key the scheduler sent.
  std::vector<std::pair<std::string, int64_t>> counts;
  for (int s = v1::TaskState_MIN; s <= v1::TaskState_MAX; ++s) {
    if (!v1::TaskState_IsValid(s) || s == v1::TASK_STATE_UNSPECIFIED) continue;
    const std::string name = core::StateName(static_cast<v1::TaskState>(s));
    auto it = stats.tasks().find(name);
    if (it != stats.tasks().end() && it->second != 0) counts.emplace_back(name, it->second);
  }
  std::vector<std::pair<std::string, int64_t>> others;
  for (const auto& [name, n] : stats.tasks()) {
    v1::TaskState unused;
    if (n != 0 && !core::ParseStateName(name, &unused)) others.emplace_back(name, n);
  }
  std::sort(others.begin(), others.end());
  counts.insert(counts.end(), others.begin(), others.end());
  if (counts.empty()) {
    Field(&out, "Tasks", "none", kWidth);
    return out;
  }
  out += "Tasks:\n";
  for (const auto& [name, n] : counts) {
    Field(&out, absl::StrCat("  ", name), absl::StrCat(n), kWidth);
  }
  return out;
}

std::string FormatJobCounts(const v1::Job& job) {
  // Known states in TaskState order, then any other key the scheduler sent.
  std::vector<std::string> parts;
  for (int s = v1::TaskState_MIN; s <= v1::TaskState_MAX; ++s) {
    if (!v1::TaskState_IsValid(s) || s == v1::TASK_STATE_UNSPECIFIED) continue;
    const std::string name = core::StateName(static_cast<v1::TaskState>(s));
    auto it = job.counts().find(name);
    if (it != job.counts().end() && it->second != 0) {
      parts.push_back(absl::StrCat(name, " ", it->second));
    }
  }
  std::vector<std::string> others;
  for (const auto& [name, n] : job.counts()) {
    v1::TaskState unused;
    if (n != 0 && !core::ParseStateName(name, &unused))
      others.push_back(absl::StrCat(name, " ", n));
  }
  std::sort(others.begin(), others.end());
  parts.insert(parts.end(), others.begin(), others.end());
  return parts.empty() ? "-" : absl::StrJoin(parts, ", ");
}

std::string FormatJobSummary(const v1::Job& job) {
  return absl::StrCat(job.id(), " ", core::JobStateName(job.state()), "  ", job.task_count(),
                      job.task_count() == 1 ? " task: " : " tasks: ", FormatJobCounts(job));
}

std::string FormatJobDetail(const v1::Job& job) {
  std::string out;
  Field(&out, "Job", job.id());
  Field(&out, "State", core::JobStateName(job.state()));
  Field(&out, "Tasks", absl::StrCat(job.task_count(), " (", FormatJobCounts(job), ")"));
  Field(&out, "Created", FormatTime(job.create_time()));
  Field(&out, "Updated", FormatTime(job.update_time()));
  return out;
}

std::string FormatJobList(const std::vector<v1::Job>& jobs) {
  Table table({"ID", "STATE", "TASKS", "COUNTS", "CREATED", "UPDATED"});
  for (const v1::Job& j : jobs) {
    table.AddRow({j.id(), core::JobStateName(j.state()), absl::StrCat(j.task_count()),
                  FormatJobCounts(j), FormatTime(j.create_time()), FormatTime(j.update_time())});
  }
  return table.Render();
}

std::string FormatClaims(const v1::ClaimResponse& resp) {
  if (resp.claims().empty()) return "no task to claim\n";
  Table table({"ID", "ATTEMPT", "EXPIRES", "STEPS"});
  for (const v1::ClaimedTask& c : resp.claims()) {
    const v1::Assignment& a = c.assignment();
    std::vector<std::string> steps;
    for (const v1::Step& s : a.steps()) steps.push_back(StepText(s));
    table.AddRow({a.task_id(), absl::StrCat(a.attempt()), FormatTime(c.expire_time()),
                  Shorten(OneLine(absl::StrJoin(steps, "; ")), 60)});
  }
  return table.Render();
}

namespace {
std::string ScheduleState(const v1::Schedule& s) { return s.paused() ? "PAUSED" : "ACTIVE"; }
}  // namespace

std::string FormatTrigger(const v1::Schedule& s) {
  if (!s.cron().empty()) {
    return absl::StrCat(s.cron(), " (", s.time_zone().empty() ? "UTC" : s.time_zone(), ")");
  }
  return absl::StrCat("every ", absl::FormatDuration(FromProto(s.interval())));
}

std::string MisfireText(v1::MisfirePolicy p) {
  switch (p) {
    case v1::MISFIRE_POLICY_SKIP:
      return "SKIP";
    case v1::MISFIRE_POLICY_RUN_ONCE:
      return "RUN_ONCE";
    case v1::MISFIRE_POLICY_CATCH_UP:
    case v1::MISFIRE_POLICY_UNSPECIFIED:
      return "CATCH_UP";
    default:  // a policy newer than this client
      return absl::StrCat(static_cast<int>(p));
  }
}

std::string FormatScheduleSummary(const v1::Schedule& s) {
  return absl::StrCat(s.id(), " ", ScheduleState(s), "  next fire ",
                      FormatTime(s.next_fire_time()));
}

std::string FormatScheduleDetail(const v1::Schedule& s) {
  std::string out;
  Field(&out, "Schedule", s.id());
  Field(&out, "State", ScheduleState(s));
  Field(&out, "Trigger", FormatTrigger(s));
  Field(&out, "Misfire", MisfireText(s.misfire_policy()));
  Field(&out, "Next fire", FormatTime(s.next_fire_time()));
  Field(&out, "Last fire", FormatTime(s.last_fire_time()));
  Field(&out, "Last task", s.last_task_id().empty() ? "-" : s.last_task_id());
  Field(&out, "Fires", absl::StrCat(s.fire_count()));
  if (s.skipped_fires() > 0) {
    Field(&out, "Skipped",
          absl::StrCat(s.skipped_fires(), " fire(s), the last at ",
                       FormatTime(s.last_skipped_time())));
  }
  if (!s.last_error().empty()) Field(&out, "Last error", OneLine(s.last_error()));
  const v1::TaskSpec& t = s.task_template();
  Field(&out, "Queue", t.queue().empty() ? "default" : t.queue());
  std::vector<std::string> steps;
  for (const v1::Step& step : t.steps()) steps.push_back(StepText(step));
  Field(&out, "Task", OneLine(absl::StrJoin(steps, "; ")));
  Field(&out, "Created", FormatTime(s.create_time()));
  Field(&out, "Updated", FormatTime(s.update_time()));
  return out;
}

std::string FormatScheduleList(const std::vector<v1::Schedule>& schedules) {
  Table table({"ID", "STATE", "TRIGGER", "NEXT FIRE", "LAST TASK", "FIRES", "LAST ERROR"});
  for (const v1::Schedule& s : schedules) {
    table.AddRow({s.id(), ScheduleState(s), FormatTrigger(s), FormatTime(s.next_fire_time()),
                  s.last_task_id().empty() ? "-" : s.last_task_id(), absl::StrCat(s.fire_count()),
                  s.last_error().empty() ? "-" : Shorten(OneLine(s.last_error()), 60)});
  }
  return table.Render();
}

}  // namespace taskgrid::ctl
