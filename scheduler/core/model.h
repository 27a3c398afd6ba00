// The task record held in memory, and the rows it is stored as.
//
// A TaskRecord is the scheduler's whole knowledge of one task. The spec is
// kept exactly as submitted (with id and queue filled in); effective values
// such as the default max_attempts are computed where they are used, so a
// resubmitted spec compares equal to the stored one.
//
// The rows are what crosses into the Store: plain values, so the store needs
// no knowledge of scheduling. A WriteBatch is the unit of one transaction.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/cron.h"
#include "common/ids.h"
#include "taskgrid/v1/job_service.pb.h"
#include "taskgrid/v1/schedule_service.pb.h"
#include "taskgrid/v1/task.pb.h"

namespace taskgrid::core {

// Entries of a per-state count array, indexed by v1::TaskState.
inline constexpr int kNumTaskStates = v1::TaskState_ARRAYSIZE;

struct JobRecord;

// Owns a T (or nothing) and copies it deeply: a member that costs one
// pointer in the many records that have none.
template <typename T>
class Boxed {
 public:
  Boxed() = default;
  Boxed(const Boxed& o) : p_(o.p_ ? std::make_unique<T>(*o.p_) : nullptr) {}
  Boxed(Boxed&&) noexcept = default;
  Boxed& operator=(const Boxed& o) {
    p_ = o.p_ ? std::make_unique<T>(*o.p_) : nullptr;
    return *this;
  }
  Boxed& operator=(Boxed&&) noexcept = default;
  T& emplace() {
    p_ = std::make_unique<T>();
    return *p_;
  }
  explicit operator bool() const { return p_ != nullptr; }
  T* operator->() const { return p_.get(); }
  T& operator*() const { return *p_; }

 private:
  std::unique_ptr<T> p_;
};

// An absl::Time in 8 bytes instead of 16: whole microseconds since the
// Unix epoch (what the stores keep), the two infinities as themselves. It
// converts to and from absl::Time, so a record's times read and assign as
// absl::Times; a time assigned loses what is finer than a microsecond.
class CompactTime {
 public:
  constexpr CompactTime() = default;  // InfinitePast
  CompactTime(absl::Time t)           // NOLINT: a time's stand-in
      : us_(t == absl::InfinitePast()     ? kPast
            : t == absl::InfiniteFuture() ? kFuture
                                          : absl::ToUnixMicros(t)) {}
  operator absl::Time() const {  // NOLINT: a time's stand-in
    return us_ == kPast     ? absl::InfinitePast()
           : us_ == kFuture ? absl::InfiniteFuture()
                            : absl::FromUnixMicros(us_);
  }
  absl::Time get() const { return *this; }

  // Comparisons among themselves and with absl::Time (one exact overload
  // for each, so neither conversion is ambiguous).
#define TASKGRID_COMPACT_TIME_COMPARE(op)                                             \
  friend bool operator op(CompactTime a, CompactTime b) { return a.us_ op b.us_; }    \
  friend bool operator op(CompactTime a, absl::Time b) { return absl::Time(a) op b; } \
  friend bool operator op(absl::Time a, CompactTime b) { return a op absl::Time(b); }
  TASKGRID_COMPACT_TIME_COMPARE(==)
  TASKGRID_COMPACT_TIME_COMPARE(!=)
  TASKGRID_COMPACT_TIME_COMPARE(<)
  TASKGRID_COMPACT_TIME_COMPARE(>)
  TASKGRID_COMPACT_TIME_COMPARE(<=)
  TASKGRID_COMPACT_TIME_COMPARE(>=)
#undef TASKGRID_COMPACT_TIME_COMPARE
  friend absl::Duration operator-(CompactTime a, CompactTime b) {
    return absl::Time(a) - absl::Time(b);
  }
  friend absl::Duration operator-(CompactTime a, absl::Time b) { return absl::Time(a) - b; }
  friend absl::Duration operator-(absl::Time a, CompactTime b) { return a - absl::Time(b); }
  friend absl::Time operator+(CompactTime a, absl::Duration d) { return absl::Time(a) + d; }
  friend absl::Time operator-(CompactTime a, absl::Duration d) { return absl::Time(a) - d; }

 private:
  static constexpr int64_t kPast = INT64_MIN;
  static constexpr int64_t kFuture = INT64_MAX;
  int64_t us_ = kPast;
};

// A std::vector that costs one pointer while it is empty, as most
// records' graph lists are: its storage is allocated with the first
// element and freed by clear(). Iterators are pointers; any change may
// move the elements, as with std::vector.
template <typename T>
class ThinVector {
 public:
  using value_type = T;
  using iterator = T*;
  using const_iterator = const T*;

  ThinVector() = default;
  ThinVector(const ThinVector& o) { *this = o; }
  ThinVector(ThinVector&&) noexcept = default;
  ThinVector(std::vector<T> v) { *this = std::move(v); }  // NOLINT: a vector's stand-in
  ThinVector& operator=(const ThinVector& o) {
    if (this != &o) v_ = o.empty() ? nullptr : std::make_unique<std::vector<T>>(*o.v_);
    return *this;
  }
  ThinVector& operator=(ThinVector&&) noexcept = default;
  ThinVector& operator=(std::vector<T> v) {
    v_ = v.empty() ? nullptr : std::make_unique<std::vector<T>>(std::move(v));
    return *this;
  }
  // The elements as a vector, for what takes one.
  operator const std::vector<T>&() const {  // NOLINT: a vector's stand-in
    static const std::vector<T>* const kEmpty = new std::vector<T>();
    return v_ ? *v_ : *kEmpty;
  }

  size_t size() const { return v_ ? v_->size() : 0; }
  bool empty() const { return size() == 0; }
  T* data() { return v_ ? v_->data() : nullptr; }
  const T* data() const { return v_ ? v_->data() : nullptr; }
  T* begin() { return data(); }
  T* end() { return data() + size(); }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size(); }
  std::reverse_iterator<const T*> rbegin() const { return std::reverse_iterator<const T*>(end()); }
  std::reverse_iterator<const T*> rend() const { return std::reverse_iterator<const T*>(begin()); }
  T& operator[](size_t i) { return (*v_)[i]; }
  const T& operator[](size_t i) const { return (*v_)[i]; }
  T& front() { return v_->front(); }
  const T& front() const { return v_->front(); }
  T& back() { return v_->back(); }
  const T& back() const { return v_->back(); }

  void reserve(size_t n) {
    if (n > 0) mut().reserve(n);
  }
  void push_back(const T& x) { mut().push_back(x); }
  void push_back(T&& x) { mut().push_back(std::move(x)); }
  template <typename... Args>
  T& emplace_back(Args&&... args) {
    return mut().emplace_back(std::forward<Args>(args)...);
  }
  T* insert(const T* pos, T x) {
    const size_t i = pos - begin();
    return &*mut().insert(mut().begin() + i, std::move(x));
  }
  void pop_back() {
    v_->pop_back();
    if (v_->empty()) v_ = nullptr;
  }
  T* erase(const T* pos) { return erase(pos, pos + 1); }
  T* erase(const T* first, const T* last) {
    if (first == last) return begin() + (first - begin());
    const size_t i = first - begin(), j = last - begin();
    v_->erase(v_->begin() + i, v_->begin() + j);
    if (v_->empty()) {
      v_ = nullptr;
      return nullptr;
    }
    return data() + i;
  }
  void clear() { v_ = nullptr; }

 private:
  std::vector<T>& mut() {
    if (v_ == nullptr) v_ = std::make_unique<std::vector<T>>();
    return *v_;
  }
  std::unique_ptr<std::vector<T>> v_;
};

// What a task delivered by merge key has gathered: every payload, its fire
// time, and their size (kept, so a merge costs no walk over them).
struct MergeState {
  v1::MergedPayloads merged;
  int64_t bytes = 0;
};

// Replicas a task may ask for (TaskSpec.replicas).
inline constexpr int32_t kMaxReplicas = 100;

// How long a gang reserves room before it lets the room go for as long
// (Replicas.gang_wait): the default and the most a spec may ask for.
inline constexpr absl::Duration kDefaultGangWait = absl::Minutes(5);
inline constexpr absl::Duration kMaxGangWait = absl::Hours(24);

// The replicas a spec asks for: one per named agent, else the count; 0
// for a task without replicas.
inline int32_t ReplicaCount(const v1::TaskSpec& spec) {
  if (!spec.has_replicas()) return 0;
  const v1::Replicas& r = spec.replicas();
  return r.agent_ids_size() > 0 ? r.agent_ids_size() : r.count();
}

// The id of replica n (from 1) of a task: "<id>:r<n>".
std::string ReplicaId(const std::string& task_id, int32_t n);

// Labels a task may carry (TaskSpec.labels).
inline constexpr int kMaxTaskLabels = 16;

// A task's labels as the stores keep them beside the spec, so an index of
// tasks on disk can be searched without reading specs: "key=value" lines
// in key order, joined by "\n" ("" for none). Keys are names (no '=' or
// '\n') and values hold no control characters (CheckTaskLabels), so a
// line is always one whole label.
std::string EncodeLabels(const google::protobuf::Map<std::string, std::string>& labels);

// Whether `t` carries every one of `want` with the same value.
bool HasLabels(const v1::TaskSpec& spec,
               const std::vector<std::pair<std::string, std::string>>& want);

// Why the scheduler itself asked an agent to stop a live attempt (a cancel,
// a pause and a gang's stop have their own marks). Ordered: a stronger one
// replaces a weaker one, never the other way round.
enum class StopRequest : uint8_t {
  kNone = 0,
  kTimedOut,     // its attempt_timeout (and the slack) passed while it ran
  kNotAccepted,  // its ack timeout passed while it was DISPATCHED
  kExpired,      // its schedule_timeout passed before it started
};

struct TaskRecord {
  v1::TaskSpec spec;
  int64_t seq = 0;  // submit order, unique and increasing
  v1::TaskState state = v1::TASK_STATE_UNSPECIFIED;
  int32_t attempt = 0;
  std::string agent_id;  // holder of the live attempt, if in flight
  CompactTime create_time;
  CompactTime update_time;
  CompactTime next_run_time;  // SCHEDULED: when it turns PENDING
  CompactTime dispatch_time;  // of the live attempt
  CompactTime start_time;     // of the live attempt
  // When it last became ready to run (PENDING, or a chain link whose
  // predecessor succeeded), until its next attempt starts: what the start
  // latency counts from. Not stored: restore takes a PENDING task's
  // update_time; InfinitePast when unknown (nothing is counted).
  CompactTime ready_time;
  std::string reason;
  // A pause is waiting for the agent to stop the live attempt.
  bool pause_requested = false;
  // A gang member stopping so that its gang starts again as a whole: its
  // attempt, once stopped, is not counted and it waits again. Not stored:
  // restore derives it (a member in flight while a sibling waits to run).
  bool requeue_requested = false;
  // The task let go of its unique_key before its ttl passed (it succeeded or
  // was cancelled): see UniqueUntil.
  bool unique_released = false;
  // The scheduler asked the agent to stop the live attempt (a timeout, or
  // a start deadline that passed while it was dispatched). The attempt
  // keeps its slot and resources until the agent says its steps are gone,
  // or the agent is lost; then it ends as the request says unless it
  // succeeded. Not stored: restore arms the deadlines again, and they set
  // it again. Said again to the agent on every reconnect, as a pause is.
  StopRequest stop_request = StopRequest::kNone;
  // Set while a pull worker holds the live attempt (a board claim; then
  // agent_id is the claim's owner, not an agent): when the claim ends
  // unless extended. InfinitePast: not a claim.
  CompactTime claim_until;
  // Set for a task with spec.merge_key: the payloads merged into it.
  Boxed<MergeState> merge;
  // The result of the last finished attempt: the default instance until
  // one finished. Boxed: most records in memory are of tasks that have not
  // run yet, and pay a pointer instead of the message.
  const v1::TaskResult& result() const {
    return result_ ? *result_ : v1::TaskResult::default_instance();
  }
  v1::TaskResult& mutable_result() { return result_ ? *result_ : result_.emplace(); }
  void set_result(v1::TaskResult r) { mutable_result() = std::move(r); }
  void clear_result() { result_ = Boxed<v1::TaskResult>(); }
  Boxed<v1::TaskResult> result_;
  // Finished attempts, oldest first: the newest max_attempt_history.
  ThinVector<v1::Attempt> attempts;
  // Finished attempts older than `attempts`, dropped to bound the history
  // (since the last reset), and how many of those were interrupted and
  // numbered above attempt_base (AttemptsUsed leaves them out, as it does
  // the interrupted ones still in `attempts`).
  int32_t attempts_dropped = 0;
  int32_t interrupted_dropped = 0;
  // Attempts numbered up to this one were made before a reset or a
  // RetryJob and no longer count against max_attempts.
  int32_t attempt_base = 0;

  // --- Derived: rebuilt by Scheduler::Restore, never stored. ---
  // TaskClass(spec), interned (Scheduler::SetClass): one string per class,
  // shared by its records, instead of one per task.
  std::shared_ptr<const std::string> class_name;
  const std::string& placement_class() const {
    static const std::string* const kNone = new std::string();
    return class_name ? *class_name : *kNone;
  }
  // A task with replicas: they, in order (its spec asks for them; they
  // are made with it). A replica: the task it is one of.
  ThinVector<TaskRecord*> replicas;
  TaskRecord* replica_of = nullptr;
  // A task with replicas: the one that ended last (its result becomes the
  // task's).
  const TaskRecord* replica_ended = nullptr;
  JobRecord* job = nullptr;
  // spec.depends_on resolved, and the tasks whose depends_on names this one
  // (in submit order).
  ThinVector<TaskRecord*> deps;
  ThinVector<TaskRecord*> dependents;
  int32_t deps_unsucceeded = 0;  // deps not SUCCEEDED
  int32_t deps_unfinished = 0;   // deps not terminal
  // Some of spec.depends_on were deleted (retention, DeleteTask) while it
  // was finished: `deps` holds the others. Such a task cannot run again.
  bool deps_deleted = false;
  // A waiting chain link its agent listed as started in a Hello: the
  // predecessor succeeded there and its result is on the way, and the
  // link's own Accept may have been lost with a scheduler that died. It is
  // taken as accepted the moment it stops waiting. (These two and id_hash
  // sit beside the counts above, in room that would be padding.)
  bool link_started = false;
  // The TaskTable's hash of id() (set as it files the record), so growing
  // its index reads the record, not the id's string. Fills padding too.
  uint32_t id_hash = 0;
  // A chain link sent to its agent with its predecessor, waiting there for
  // it to succeed: no slot, no ack deadline yet. And the reverse link.
  TaskRecord* chained_after = nullptr;
  TaskRecord* chain_next = nullptr;
  // The revision of its last change (the event the table wrote for it):
  // a finished task leaves memory only once that change is committed.
  int64_t revision = 0;

  const std::string& id() const { return spec.id(); }
  const std::string& queue() const { return spec.queue(); }
  bool claimed() const { return claim_until != absl::InfinitePast(); }
  const std::string& job_id() const { return spec.job_id(); }
};

// A job: the tasks submitted together by SubmitJob. Derived from the tasks'
// job ids (never stored on its own).
struct JobRecord {
  std::string id;
  int64_t seq = 0;  // its first task's; orders ListJobs
  absl::Time create_time = absl::InfinitePast();
  absl::Time update_time = absl::InfinitePast();
  std::vector<TaskRecord*> tasks;  // submit order
  // A job whose tasks are all on disk only (finished, evicted together):
  // their seqs, in submit order; `tasks` is then empty.
  std::vector<int64_t> cold;
  std::array<int64_t, kNumTaskStates> counts{};

  size_t size() const { return tasks.size() + cold.size(); }
};

// A finished task kept on disk only: its record left memory (Scheduler::
// Evict), and what the indexes need of it stays. GetTask and ListTasks
// read the row back; an operation that changes it reads it back into
// memory first (Scheduler::Warm).
struct ColdTask {
  ColdTask() : replica(false), has_replicas(false) {}

  // Its id. The characters are kept on their own, with the size beside
  // the other small members: 24 bytes less than a std::string, in a table
  // that may hold millions of these. An id of kLongId characters or more
  // (none since ids have a limit, but a table may be older) keeps its
  // size in the buffer's first eight bytes instead.
  absl::string_view id() const {
    if (id_size != kLongId) return absl::string_view(id_chars.get(), id_size);
    size_t size;
    std::memcpy(&size, id_chars.get(), sizeof(size));
    return absl::string_view(id_chars.get() + sizeof(size), size);
  }
  void set_id(absl::string_view id) {
    if (id.size() < kLongId) {
      id_chars = std::make_unique<char[]>(id.size());
      std::copy(id.begin(), id.end(), id_chars.get());
      id_size = static_cast<uint16_t>(id.size());
      return;
    }
    const size_t size = id.size();
    id_chars = std::make_unique<char[]>(sizeof(size) + size);
    std::memcpy(id_chars.get(), &size, sizeof(size));
    std::copy(id.begin(), id.end(), id_chars.get() + sizeof(size));
    id_size = kLongId;
  }
  // A finished state, in a byte.
  v1::TaskState state() const { return static_cast<v1::TaskState>(state_code); }
  void set_state(v1::TaskState s) { state_code = static_cast<uint8_t>(s); }

  static constexpr uint16_t kLongId = 0xffff;
  std::unique_ptr<char[]> id_chars;
  int64_t seq = 0;
  const std::string* queue = nullptr;  // interned by the TaskTable
  JobRecord* job = nullptr;
  CompactTime finish;    // its update time (the row's update_us)
  int32_t attempt = 0;   // its last attempt number
  uint32_t labels = 0;   // its label set, interned by the TaskTable (0: none)
  uint32_t id_hash = 0;  // the TaskTable's hash of id(), kept for its index's rehashes
  uint16_t id_size = 0;  // of id_chars, or kLongId
  uint8_t state_code = v1::TASK_STATE_UNSPECIFIED;
  bool replica : 1;       // one of a task's replicas (goes with its task)
  bool has_replicas : 1;  // its replicas go with it
};

// A schedule id leaves room in a task id (kMaxIdLength) for the fire
// time its tasks' ids add: ":YYYYMMDDTHHMMSSZ".
inline constexpr size_t kFireTimeSuffixLength = 17;
inline constexpr size_t kMaxScheduleIdLength = kMaxIdLength - kFireTimeSuffixLength;

// A schedule: its definition, compiled, and where its fires stand.
struct ScheduleRecord {
  // The definition as created (no reported fields, paused cleared), with
  // the defaults filled in: time zone, misfire policy, the template's queue.
  v1::Schedule def;
  cron::CronExpr cron;                             // def.cron parsed (cron schedules)
  absl::TimeZone zone;                             // def.time_zone loaded
  absl::Duration interval = absl::ZeroDuration();  // > 0: an interval schedule
  bool paused = false;
  // The next fire time (kept while paused; a resume computes it anew).
  absl::Time next_fire = absl::InfiniteFuture();
  absl::Time last_fire = absl::InfinitePast();  // of the latest task created
  std::string last_task_id;
  int64_t fire_count = 0;
  std::string last_error;
  absl::Time create_time = absl::InfinitePast();
  absl::Time update_time = absl::InfinitePast();
  // Derived at start-up: next_fire had passed while the scheduler was
  // down, so the misfire policy decides what the next tick fires.
  bool missed = false;
  // Fires that did not run (the misfire policy after an outage, or a stall
  // while running that left only the latest to fire), and the latest of
  // them (InfinitePast: none).
  int64_t skipped_fires = 0;
  absl::Time last_skipped = absl::InfinitePast();

  const std::string& id() const { return def.id(); }
  // Interval fires count from here: the creation, rounded up to a whole
  // second, so the first fire comes one whole interval after the creation
  // (or up to a second more), never sooner.
  absl::Time anchor() const {
    return absl::UnixEpoch() + absl::Ceil(create_time - absl::UnixEpoch(), absl::Seconds(1));
  }
};

// One row of the tasks table.
struct TaskRow {
  bool insert = false;  // true: a new row with its spec; false: status columns only
  std::string id;
  int64_t seq = 0;
  std::string queue;
  int32_t state = 0;
  int32_t attempt = 0;
  std::string agent_id;
  int64_t create_us = 0;
  int64_t update_us = 0;
  int64_t next_run_us = 0;
  int64_t dispatch_us = 0;
  int64_t start_us = 0;
  std::string reason;
  bool pause_requested = false;
  std::string result;  // serialized v1::TaskResult
  std::string spec;    // serialized v1::TaskSpec (set on insert)
  std::string job_id;  // (set on insert)
  int32_t attempt_base = 0;
  int32_t attempts_dropped = 0;
  int32_t interrupted_dropped = 0;
  int64_t claim_until_us = 0;  // 0: not a board claim
  int64_t merge_fire_us = 0;   // a task with a merge key: when it fires
  // Unique by key: the key (set on insert), and until when it holds it
  // (0: no key, or let go of it), so a restart rebuilds the holds without
  // reading specs.
  std::string unique_key;
  int64_t unique_until_us = 0;
  std::string labels;  // EncodeLabels of the spec's (set on insert)
  // Set by a scan that reads finished tasks' rows light (Store::ScanTasks):
  // only id, seq, queue, state, attempt, create_us, update_us, job_id,
  // unique_key, unique_until_us, labels and the two replica flags are filled.
  bool light = false;
  bool replica = false;       // light rows: the spec names replica_of
  bool has_replicas = false;  // light rows: the spec asks for replicas
};

// A finished task deleted for good (retention, DeleteTask): its row, its
// finished attempts and its merged payloads.
struct TaskDelete {
  int64_t seq = 0;
  std::string id;
};

// One finished attempt.
struct AttemptRow {
  std::string task_id;
  int32_t attempt = 0;
  std::string data;  // serialized v1::Attempt
};

// One payload gathered by a task with a merge key: the n-th, from 0.
// Written once, when it is merged; a merge never rewrites what the task
// gathered before.
struct MergedRow {
  std::string task_id;
  int32_t n = 0;
  std::string payload;
};

// What a queue is told (PauseQueue, SetQueueLimits): the serialized
// v1.QueueSettings; empty when the queue is back to the defaults (the row
// is deleted). Later rows for a queue replace earlier ones.
struct QueueRow {
  std::string queue;
  std::string settings;
};

// One state change: the event log that WatchTasks will serve.
struct EventRow {
  int64_t revision = 0;  // assigned by the Scheduler: +1 per change
  std::string task_id;
  std::string queue;
  int32_t from_state = 0;
  int32_t to_state = 0;
  int32_t attempt = 0;
  std::string agent_id;
  int64_t time_us = 0;
  std::string reason;
  std::string job_id;
};

// One row of the schedules table: a schedule's definition and where its
// fires stand. Written whole (insert or replace) on every change, in the
// transaction of the task its fire created.
struct ScheduleRow {
  bool erase = false;  // true: delete the schedule (only `id` is read)
  std::string id;
  // Serialized v1::Schedule: the definition fields, and skipped_fires and
  // last_skipped_time (kept in the blob so that neither store's schema
  // changes for them).
  std::string definition;
  bool paused = false;
  int64_t next_fire_us = 0;
  int64_t last_fire_us = 0;  // 0: never fired
  std::string last_task_id;
  int64_t fire_count = 0;
  std::string last_error;
  int64_t create_us = 0;
  int64_t update_us = 0;
};

struct WriteBatch {
  std::vector<TaskRow> tasks;
  std::vector<AttemptRow> attempts;
  std::vector<std::string> clear_attempts;  // task ids whose history is cleared (reset)
  // (task id, n): delete the task's attempts numbered below n (the oldest,
  // past the history bound). Applied after `attempts`.
  std::vector<std::pair<std::string, int32_t>> trim_attempts;
  std::vector<MergedRow> merged;
  std::vector<QueueRow> queues;
  std::vector<EventRow> events;
  // Applied in order, after the task rows.
  std::vector<ScheduleRow> schedules;
  // Event history retention: delete events with revision <= this (0: none).
  int64_t prune_events_through = 0;
  // Finished tasks deleted for good; applied before everything else (so a
  // task submitted again under a deleted id in the same transaction keeps
  // its rows).
  std::vector<TaskDelete> deletes;

  bool empty() const {
    return tasks.empty() && attempts.empty() && clear_attempts.empty() && trim_attempts.empty() &&
           merged.empty() && queues.empty() && events.empty() && schedules.empty() &&
           prune_events_through == 0 && deletes.empty();
  }
  size_t size() const {
    return tasks.size() + attempts.size() + clear_attempts.size() + trim_attempts.size() +
           merged.size() + queues.size() + events.size() + schedules.size() + deletes.size();
  }
  // Moves every row of `other` to the end of this batch.
  void Append(WriteBatch&& other);
};

// What recovery reads back: a task row, its finished attempts and what it
// gathered by merge key.
struct StoredTask {
  TaskRow row;
  std::vector<AttemptRow> attempts;
  std::vector<MergedRow> merged;
};

// Until when `t` holds its unique_key: unique_ttl from its not_before, or
// from its submit when that is later or unset. InfinitePast: it has no key,
// or has let go of it.
absl::Time UniqueUntil(const TaskRecord& t);

TaskRow ToRow(const TaskRecord& t, bool insert);
AttemptRow ToAttemptRow(const std::string& task_id, const v1::Attempt& a);
// The record of a stored task: its row (whose strings are moved out), its
// finished attempts, oldest first, and its merged payloads in order.
// DataLoss when a blob does not parse or a merged payload is missing.
absl::StatusOr<std::unique_ptr<TaskRecord>> FromStored(TaskRow&& row,
                                                       absl::Span<const AttemptRow> attempts,
                                                       absl::Span<const MergedRow> merged = {});

// The API view of a record.
void ToTaskProto(const TaskRecord& t, v1::Task* out);

// A job's state, from its tasks' counts: RUNNING while one has not
// finished; then FAILED if one failed or was put aside (TRASHED),
// CANCELLED if one was cancelled, else SUCCEEDED.
v1::JobState JobStateOf(const JobRecord& j);

}  // namespace taskgrid::core
