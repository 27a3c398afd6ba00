// The task table: every task and job record, the indexes by state that do
// not belong to dispatching (per-queue and per-job counts, the timer of
// SCHEDULED tasks), submit order, id minting, and the revision counter of
// the event log. Apply() is the one door for a task's state: it updates
// these indexes and appends the task and event rows, and returns what
// changed; the Scheduler does the rest (ready queues, dependents).
//
// A finished task whose record left memory is a ColdTask here (Evict):
// its id stays taken, its state counted, its job and queue known; the
// Scheduler decides when a task may go and reads it back (Warm).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "scheduler/core/model.h"

namespace taskgrid::core {

class TaskTable {
 public:
  using Counts = std::array<int64_t, kNumTaskStates>;

  // Tasks on disk only live in a pool of fixed chunks (stable addresses,
  // no allocation of its own per entry; a deleted one's slot is used
  // again). Both of their indexes hold a slot's 4-byte number rather than
  // an 8-byte pointer, and the index by seq keeps no copy of the seq: at a
  // million tasks on disk that is 21 MB less than a set of pointers and a
  // map of (seq, pointer).
  struct ColdRef {
    uint32_t slot;
  };
  class ColdPool {
   public:
    ColdPool() = default;
    ColdPool(const ColdPool&) = delete;
    ColdPool& operator=(const ColdPool&) = delete;
    ColdTask& operator[](ColdRef r) { return chunks_[r.slot >> kChunkBits][r.slot & kChunkMask]; }
    const ColdTask& operator[](ColdRef r) const {
      return chunks_[r.slot >> kChunkBits][r.slot & kChunkMask];
    }
    // A slot holding `c`: a freed one if any.
    ColdRef Add(ColdTask c);
    // Empties the slot (its id's buffer goes) for a later Add.
    void Free(ColdRef r);

   private:
    static constexpr int kChunkBits = 12;
    static constexpr uint32_t kChunkMask = (1u << kChunkBits) - 1;
    std::vector<std::unique_ptr<ColdTask[]>> chunks_;
    uint32_t used_ = 0;  // slots handed out of the chunks so far
    std::vector<uint32_t> free_;
  };
  // The index by seq: slots ordered by their task's seq, found by a seq.
  struct ColdSeqLess {
    using is_transparent = void;
    const ColdPool* pool;
    int64_t Key(int64_t seq) const { return seq; }
    int64_t Key(ColdRef r) const { return (*pool)[r].seq; }
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      return Key(a) < Key(b);
    }
  };
  using ColdBySeq = absl::btree_set<ColdRef, ColdSeqLess>;

  TaskTable() = default;
  TaskTable(const TaskTable&) = delete;  // the cold indexes point at cold_pool_
  TaskTable& operator=(const TaskTable&) = delete;

  // --- Records. ---
  TaskRecord* Find(absl::string_view id) const;
  size_t size() const { return tasks_.size(); }
  void Reserve(size_t n) { tasks_.reserve(n); }
  // A new task (state UNSPECIFIED until its first Apply): takes the next
  // submit seq. The id must be free.
  TaskRecord& Insert(std::unique_ptr<TaskRecord> t);
  // A stored task read back, keeping its seq and state (not yet in the
  // state indexes: Enter() it once its job is linked). DataLoss when its
  // id is stored twice.
  absl::StatusOr<TaskRecord*> Adopt(std::unique_ptr<TaskRecord> t);
  // Submit order.
  const absl::btree_map<int64_t, TaskRecord*>& by_seq() const { return by_seq_; }
  // The seq the next inserted task gets (a new job takes its first task's).
  int64_t next_seq() const { return next_seq_; }
  // A free generated id (no task in memory or on disk has it);
  // time-ordered, so ids sort by creation time.
  std::string NewTaskId(absl::Time now);
  // Whether a task with this id exists, in memory or on disk only.
  bool Taken(absl::string_view id) const { return Find(id) != nullptr || FindCold(id) != nullptr; }

  // --- Finished tasks on disk only. Their counts stay in CountsOf and
  // their jobs' counts. ---
  const ColdTask* FindCold(absl::string_view id) const;
  const ColdTask* FindColdBySeq(int64_t seq) const;
  // Submit order; cold(r) is the task under a slot.
  const ColdBySeq& cold_by_seq() const { return cold_by_seq_; }
  const ColdTask& cold(ColdRef r) const { return cold_pool_[r]; }
  size_t cold_size() const { return cold_by_seq_.size(); }
  // The labels of a task on disk: its EncodeLabels lines with a "\n" at
  // both ends, so a label is found whole as "\nkey=value\n"; "" for none.
  absl::string_view LabelsOf(const ColdTask& c) const { return label_sets_[c.labels].lines; }
  // For CheckInvariants: "" when every label set is counted by exactly
  // the tasks on disk that carry it and found by its lines; else what is wrong.
  std::string CheckLabelSets() const;
  // `t` (finished, in no job, linked to nothing in memory) leaves memory;
  // a ColdTask takes its place.
  void Evict(TaskRecord& t);
  // Every task of `j` (each finished and linked to nothing in memory
  // outside the job) leaves memory; the job keeps their seqs in `cold`.
  void EvictJob(JobRecord& j);
  // A finished task read back light at start-up (TaskRow::light), kept on
  // disk only. DataLoss when its id is taken.
  absl::Status AdoptCold(const TaskRow& row);
  // Start-up: the task on disk under `seq` is read back whole after all
  // (something in memory needs it): it leaves the index of tasks on disk,
  // its counts with it, so Adopt and Enter take it like any other.
  void UnadoptCold(int64_t seq);
  // `t`, read back from the store, takes its ColdTask's place in memory:
  // same seq, state and counts; t->job is set, and the job's lists are the
  // caller's (WarmJob, once every task of the job is back). nullptr (and
  // `t` dropped) unless the task is on disk with that seq and update
  // time, i.e. `t` is its stored row as it is now.
  TaskRecord* Warm(std::unique_ptr<TaskRecord> t);
  // A job whose tasks were all warmed: they go back to `tasks`, in order.
  // False (and nothing changed) while one of them is still on disk.
  bool WarmJob(JobRecord& j);
  // Deletes a task on disk (in no job) for good: its counts, and a
  // TaskDelete in `batch`.
  void DeleteCold(const ColdTask& c, WriteBatch* batch);
  // Deletes a job whose tasks are all on disk, with its tasks.
  void DeleteColdJob(JobRecord& j, WriteBatch* batch);

  // --- Jobs. ---
  JobRecord* FindJob(const std::string& id) const;
  // A job with this id (new if need be); its seq and create time are its
  // first task's (the smallest `seq` seen, so tasks may come in any order).
  JobRecord& FindOrAddJob(const std::string& id, int64_t seq, absl::Time create_time);
  const absl::btree_map<int64_t, JobRecord*>& jobs_by_seq() const { return jobs_by_seq_; }
  const absl::flat_hash_map<std::string, std::unique_ptr<JobRecord>>& jobs() const { return jobs_; }
  std::string NewJobId(absl::Time now);

  // --- State. ---
  // The one door: moves `t` to `to` (an allowed transition, or the first
  // state of a new task), leaving and entering the state indexes, and
  // appends its row and an event row to `batch`. `event_agent`: the agent
  // the event names when the task no longer has one. Returns the old state.
  v1::TaskState Apply(TaskRecord& t, v1::TaskState to, std::string reason, absl::Time now,
                      const std::string* event_agent, WriteBatch* batch);
  // A change to `t` that keeps its state (a merge: payloads, fire time):
  // `change` runs between leaving and entering the indexes, and the row
  // and an event row (from = to = the state, with `reason`) are appended,
  // so watchers see it too.
  void Amend(TaskRecord& t, const std::function<void(TaskRecord&)>& change, std::string reason,
             absl::Time now, WriteBatch* batch);
  // The indexes t.state puts a task in (counts, the timer). Apply leaves
  // and enters them; a restore enters each task once.
  void Enter(TaskRecord& t);
  void Leave(TaskRecord& t);
  // The SCHEDULED task due first if it is due by `now`, else nullptr.
  TaskRecord* NextDue(absl::Time now) const;
  const absl::btree_set<std::tuple<absl::Time, int64_t, TaskRecord*>>& scheduled() const {
    return scheduled_;
  }
  // Tasks of `queue` by state; all zero for a queue never seen.
  const Counts& CountsOf(const std::string& queue) const;
  const absl::flat_hash_map<std::string, Counts>& counts() const { return counts_; }
  // The PENDING task of `queue` submitted first, or nullptr: how long the
  // backlog has waited, in O(1) (the metrics ask for every queue).
  const TaskRecord* OldestPending(const std::string& queue) const;

  // --- Revisions of the event log. ---
  int64_t last_revision() const { return last_revision_; }
  int64_t oldest_revision() const { return oldest_revision_; }
  // Restore: the log as stored; history from before counts as of `now`.
  void SetRevisions(int64_t last, int64_t oldest, absl::Time now);
  // Event retention: the newest revision older than `cutoff` to prune
  // through (0: none); the oldest kept moves past it.
  int64_t PruneBefore(absl::Time cutoff);

 private:
  // Apply's and Amend's second half: t's reason and update time, its row
  // and the event row (from -> t.state).
  void Record(TaskRecord& t, v1::TaskState from, std::string reason, absl::Time now,
              const std::string* event_agent, WriteBatch* batch);
  // DeleteCold without the job check.
  void EraseCold(const ColdTask& c, WriteBatch* batch);
  // The interned name of a queue (stable for the table's life).
  const std::string* Intern(const std::string& queue);
  // Keyed by the record's own spec.id() (never changed once the task is in
  // the set), so a million tasks do not hold a second copy of every id, and
  // a slot is one pointer (a map's slot of view and pointer took three: a
  // restart of a million tasks held 34 MB more).
  // Both id indexes (records in memory, tasks on disk) hash an id to 32
  // bits and keep that hash in the element (its `id_hash`): growing an
  // index then reads each element once instead of following its id to the
  // string (a restart grows them ~20 times). Found by id (transparent).
  static uint32_t HashId(absl::string_view id) {
    return static_cast<uint32_t>(absl::Hash<absl::string_view>()(id));
  }
  // Both id indexes' hash and equality, one template: `Entry` maps an
  // element of the index to the entry that holds the id and its hash.
  template <typename Element, typename Entry>
  struct IdHash {
    using is_transparent = void;
    Entry entry;
    size_t operator()(absl::string_view id) const { return HashId(id); }
    size_t operator()(const Element& e) const { return entry(e).id_hash; }
  };
  template <typename Element, typename Entry>
  struct IdEq {
    using is_transparent = void;
    Entry entry;
    absl::string_view Key(absl::string_view id) const { return id; }
    absl::string_view Key(const Element& e) const { return entry(e).id(); }
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      return Key(a) == Key(b);
    }
  };
  struct OwnedRecord {
    const TaskRecord& operator()(const std::unique_ptr<TaskRecord>& p) const { return *p; }
  };
  struct PooledCold {
    const ColdPool* pool;
    const ColdTask& operator()(ColdRef r) const { return (*pool)[r]; }
  };
  // Sets owned->id_hash and files `owned`; false (and `owned` left alone)
  // when the id is taken.
  bool FileRecord(std::unique_ptr<TaskRecord>& owned);
  absl::flat_hash_set<std::unique_ptr<TaskRecord>, IdHash<std::unique_ptr<TaskRecord>, OwnedRecord>,
                      IdEq<std::unique_ptr<TaskRecord>, OwnedRecord>>
      tasks_;
  // Tasks on disk only, found by id (the same hash as tasks_, through the
  // slot) and by seq.
  // Files `c` with its labels (EncodeLabels) in the indexes, from the pool;
  // nullptr (nothing filed) when its id is on disk already.
  const ColdTask* FileCold(ColdTask c, absl::string_view labels);
  // Takes `c` out of the indexes; its slot goes back to the pool.
  void UnfileCold(const ColdTask* c);
  ColdPool cold_pool_;  // before the indexes, which point at it
  absl::flat_hash_set<ColdRef, IdHash<ColdRef, PooledCold>, IdEq<ColdRef, PooledCold>> cold_{
      0, IdHash<ColdRef, PooledCold>{PooledCold{&cold_pool_}},
      IdEq<ColdRef, PooledCold>{PooledCold{&cold_pool_}}};
  ColdBySeq cold_by_seq_{ColdSeqLess{&cold_pool_}};
  // Label sets of tasks on disk, each kept once however many tasks carry
  // it, and freed with the last of them (tasks labelled one by one would
  // otherwise keep every set they ever had). Entry 0 is "no labels".
  struct LabelSet {
    std::string lines;  // LabelsOf's form
    int64_t refs = 0;
  };
  uint32_t InternLabels(absl::string_view labels);
  void ReleaseLabels(uint32_t index);
  std::deque<LabelSet> label_sets_{LabelSet()};  // stable: label_index_ views the lines
  std::vector<uint32_t> label_free_;
  absl::flat_hash_map<absl::string_view, uint32_t> label_index_;
  absl::node_hash_set<std::string> queue_names_;
  const std::string* last_interned_ = nullptr;  // into queue_names_
  // B-trees: a node per ~10 entries instead of a node (a malloc) per task.
  absl::btree_map<int64_t, TaskRecord*> by_seq_;
  int64_t next_seq_ = 1;
  uint64_t id_counter_ = 0;
  absl::flat_hash_map<std::string, std::unique_ptr<JobRecord>> jobs_;
  absl::btree_map<int64_t, JobRecord*> jobs_by_seq_;
  absl::btree_set<std::tuple<absl::Time, int64_t, TaskRecord*>> scheduled_;  // SCHEDULED
  absl::flat_hash_map<std::string, Counts> counts_;                          // queue -> state
  // PENDING tasks by queue, in submit order; a queue without any is erased.
  absl::flat_hash_map<std::string, absl::btree_set<std::pair<int64_t, TaskRecord*>>> pending_;
  int64_t last_revision_ = 0;
  int64_t oldest_revision_ = 1;
  // (revision, time) about once a second: what retention may prune.
  std::deque<std::pair<int64_t, absl::Time>> revision_marks_;
};

}  // namespace taskgrid::core
