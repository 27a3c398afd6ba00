#include "scheduler/store/sqlite_store.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sqlite3.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/proto_time.h"
#include "common/status_macros.h"
#include "scheduler/core/state_machine.h"
#include "scheduler/store/sqlite_util.h"

namespace taskgrid::store {

using sqlite::AssignColumn;
using sqlite::BindBlob;
using sqlite::BindText;
using sqlite::ColumnString;
using sqlite::Exec;
using sqlite::SqlError;
using sqlite::Statement;
using sqlite::Step;

namespace {

// The columns of a whole task row, in the order ReadRow reads them.
constexpr char kTaskColumns[] =
    "id, seq, queue, state, attempt, agent_id, create_us, update_us, next_run_us, dispatch_us, "
    "start_us, reason, result, spec, pause_requested, job_id, attempt_base, attempts_dropped, "
    "interrupted_dropped, claim_until_us, merge_fire_us, unique_key, unique_until_us, family, "
    "labels";

// One row of kTaskColumns into `r`; assign() into a row left by an earlier
// chunk reuses its buffers. `light_finished`: a finished task's row is read
// light (TaskRow::light), never touching its blobs.
void ReadRow(sqlite3_stmt* st, bool light_finished, core::TaskRow* r) {
  r->insert = false;
  r->state = sqlite3_column_int(st, 3);
  r->light = light_finished && core::IsTerminal(static_cast<v1::TaskState>(r->state));
  AssignColumn(st, 0, &r->id);
  r->seq = sqlite3_column_int64(st, 1);
  AssignColumn(st, 2, &r->queue);
  r->attempt = sqlite3_column_int(st, 4);
  r->create_us = sqlite3_column_int64(st, 6);
  r->update_us = sqlite3_column_int64(st, 7);
  AssignColumn(st, 15, &r->job_id);
  AssignColumn(st, 21, &r->unique_key);
  r->unique_until_us = sqlite3_column_int64(st, 22);
  const int family = sqlite3_column_int(st, 23);
  r->replica = family == 1;
  r->has_replicas = family == 2;
  AssignColumn(st, 24, &r->labels);
  if (r->light) {
    for (std::string* cleared : {&r->agent_id, &r->reason, &r->result, &r->spec}) cleared->clear();
    return;
  }
  AssignColumn(st, 5, &r->agent_id);
  r->next_run_us = sqlite3_column_int64(st, 8);
  r->dispatch_us = sqlite3_column_int64(st, 9);
  r->start_us = sqlite3_column_int64(st, 10);
  AssignColumn(st, 11, &r->reason);
  AssignColumn(st, 12, &r->result);
  AssignColumn(st, 13, &r->spec);
  r->pause_requested = sqlite3_column_int(st, 14) != 0;
  r->attempt_base = sqlite3_column_int(st, 16);
  r->attempts_dropped = sqlite3_column_int(st, 17);
  r->interrupted_dropped = sqlite3_column_int(st, 18);
  r->claim_until_us = sqlite3_column_int64(st, 19);
  r->merge_fire_us = sqlite3_column_int64(st, 20);
}

// Reads the pid written into an existing lock file, for the error message.
std::string LockHolder(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  char buf[32] = {0};
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return "";
  return std::string(absl::StripAsciiWhitespace(absl::string_view(buf, n)));
}

}  // namespace

namespace {

// Makes `dir` (0700, whatever the umask) if it is not there; refuses one
// that users other than its owner may write (they could replace the task
// table): writable by others, or by a group other than the owner's own
// private group.
absl::Status PrivateDirectory(const std::string& dir) {
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot use data directory ", dir, ": ", strerror(errno)));
    }
    std::error_code ec;
    const std::filesystem::path parent = std::filesystem::path(dir).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    if (ec || (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) || chmod(dir.c_str(), 0700) != 0 ||
        stat(dir.c_str(), &st) != 0) {
      return absl::FailedPreconditionError(absl::StrCat("cannot create data directory ", dir, ": ",
                                                        ec ? ec.message() : strerror(errno)));
    }
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("data directory ", dir, " is not a directory"));
  }
  bool others_write = (st.st_mode & S_IWOTH) != 0;
  if ((st.st_mode & S_IWGRP) != 0) {
    // A group of its own (the user private groups of most distributions)
    // holds nobody else.
    const group* g = getgrgid(st.st_gid);
    const passwd* owner = getpwuid(st.st_uid);
    const bool private_group = g != nullptr && owner != nullptr && g->gr_mem[0] == nullptr &&
                               std::string(g->gr_name) == owner->pw_name;
    others_write = others_write || !private_group;
  }
  if (others_write) {
    return absl::FailedPreconditionError(absl::StrCat(
        "data directory ", dir, " can be written by other users (mode ",
        absl::StrFormat("%04o", st.st_mode & 07777),
        "): they could replace the task table. Make it private (chmod 700 ", dir,
        "; taskgrid-scheduler creates a missing one so) or choose another --data_dir"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SqliteStore>> SqliteStore::Open(const SqliteOptions& opts) {
  std::unique_ptr<SqliteStore> s(new SqliteStore());
  if (absl::Status st = s->Init(opts); !st.ok()) return st;
  return s;
}

absl::Status SqliteStore::Init(const SqliteOptions& opts) {
  if (opts.data_dir.empty()) return absl::InvalidArgumentError("data_dir is empty");
  if (absl::Status st = PrivateDirectory(opts.data_dir); !st.ok()) return st;
  const std::string lock_path = opts.data_dir + "/LOCK";
  lock_fd_ = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open ", lock_path, ": ", strerror(errno)));
  }
  if (flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    const std::string holder = LockHolder(lock_path);
    close(lock_fd_);
    lock_fd_ = -1;
    return absl::FailedPreconditionError(
        absl::StrCat("data directory ", opts.data_dir, " is in use by another taskgrid-scheduler",
                     holder.empty() ? "" : absl::StrCat(" (pid ", holder, ")"),
                     "; two schedulers must never write one task table"));
  }
  const std::string pid = absl::StrCat(getpid(), "\n");
  if (ftruncate(lock_fd_, 0) != 0 || pwrite(lock_fd_, pid.data(), pid.size(), 0) < 0) {
    return absl::InternalError(absl::StrCat("cannot write ", lock_path, ": ", strerror(errno)));
  }

  db_path_ = opts.data_dir + "/taskgrid.db";
  // Every task's env, payload and output is in these files: 0600 whatever
  // the umask, also for files an older version made. SQLite gives the WAL
  // and shared-memory files it creates the database file's mode.
  for (const char* suffix : {"", "-wal", "-shm"}) {
    const std::string path = db_path_ + suffix;
    const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC | (*suffix == '\0' ? O_CREAT : 0), 0600);
    if (fd < 0 && errno == ENOENT) continue;
    if (fd < 0 || fchmod(fd, 0600) != 0 || fchmod(lock_fd_, 0600) != 0) {
      const int err = errno;
      if (fd >= 0) close(fd);
      return absl::FailedPreconditionError(
          absl::StrCat("cannot make ", path, " private (mode 0600): ", strerror(err)));
    }
    close(fd);
  }
  if (sqlite3_open_v2(db_path_.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE,
                      nullptr) != SQLITE_OK) {
    return SqlError(db_, absl::StrCat("cannot open ", db_path_));
  }
  sqlite3_busy_timeout(db_, 5000);
  if (absl::Status s = Exec(db_, "PRAGMA journal_mode=WAL"); !s.ok()) return s;
  if (absl::Status s =
          Exec(db_, opts.durability == Durability::kFull ? "PRAGMA synchronous=FULL"
                                                         : "PRAGMA synchronous=NORMAL");
      !s.ok()) {
    return s;
  }
  // 64 MiB of page cache (SQLite's default is 2 MiB): a table of a million
  // tasks is a few hundred MiB, and every page a commit touches that is not
  // cached is a pread.
  if (absl::Status s = Exec(db_, "PRAGMA cache_size=-65536"); !s.ok()) return s;
  if (absl::Status s = Migrate(); !s.ok()) return s;
  if (absl::Status s = Prepare(); !s.ok()) return s;
  if (absl::Status s = StartCheckpointer(opts.durability); !s.ok()) return s;
  // NOMUTEX: read_mu_ already serializes its use.
  if (sqlite3_open_v2(db_path_.c_str(), &read_db_, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX,
                      nullptr) != SQLITE_OK) {
    return SqlError(read_db_, "cannot open the read connection");
  }
  sqlite3_busy_timeout(read_db_, 5000);
  if (sqlite3_prepare_v3(
          read_db_,
          "SELECT revision, task_id, queue, from_state, to_state, attempt, agent_id, "
          "time_us, reason, job_id FROM events WHERE revision > ?1 ORDER BY revision LIMIT ?2",
          -1, SQLITE_PREPARE_PERSISTENT, &read_events_, nullptr) != SQLITE_OK) {
    return SqlError(read_db_, "preparing the event read");
  }
  // Reads of tasks kept on disk (GetTask, ListTasks, warming) on a
  // connection of their own, beside the event reads.
  if (sqlite3_open_v2(db_path_.c_str(), &task_db_, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX,
                      nullptr) != SQLITE_OK) {
    return SqlError(task_db_, "cannot open the task read connection");
  }
  sqlite3_busy_timeout(task_db_, 5000);
  struct {
    sqlite3_stmt** st;
    std::string sql;
  } reads[] = {
      {&read_task_, absl::StrCat("SELECT ", kTaskColumns, " FROM tasks WHERE seq = ?1")},
      {&read_task_attempts_,
       "SELECT attempt, data FROM attempts WHERE task_id = ?1 ORDER BY attempt"},
      {&read_task_merged_, "SELECT n, payload FROM merged WHERE task_id = ?1 ORDER BY n"},
  };
  for (auto& r : reads) {
    if (sqlite3_prepare_v3(task_db_, r.sql.c_str(), -1, SQLITE_PREPARE_PERSISTENT, r.st, nullptr) !=
        SQLITE_OK) {
      return SqlError(task_db_, absl::StrCat("preparing ", r.sql));
    }
  }
  return absl::OkStatus();
}

absl::Status SqliteStore::Prepare() {
  struct {
    sqlite3_stmt** st;
    const char* sql;
  } stmts[] = {
      {&begin_, "BEGIN IMMEDIATE"},
      {&commit_, "COMMIT"},
      {&rollback_, "ROLLBACK"},
      {&insert_task_,
       "INSERT INTO tasks (id, seq, queue, state, attempt, agent_id, create_us, update_us, "
       "next_run_us, dispatch_us, start_us, reason, result, spec, pause_requested, job_id, "
       "attempt_base, attempts_dropped, interrupted_dropped, claim_until_us, merge_fire_us, "
       "unique_key, unique_until_us, family, labels) "
       "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, "
       "?19, ?20, ?21, ?22, ?23, ?24, ?25)"},
      {&delete_task_, "DELETE FROM tasks WHERE seq = ?1 AND id = ?2"},
      {&delete_merged_, "DELETE FROM merged WHERE task_id = ?1"},
      {&update_task_,
       "UPDATE tasks SET state = ?2, attempt = ?3, agent_id = ?4, update_us = ?5, "
       "next_run_us = ?6, dispatch_us = ?7, start_us = ?8, reason = ?9, result = ?10, "
       "pause_requested = ?11, attempt_base = ?12, attempts_dropped = ?14, "
       "interrupted_dropped = ?15, claim_until_us = ?16, merge_fire_us = ?17, "
       "unique_until_us = ?18 WHERE seq = ?13 AND id = ?1"},
      {&insert_merged_, "INSERT OR REPLACE INTO merged (task_id, n, payload) VALUES (?1, ?2, ?3)"},
      {&put_queue_, "INSERT OR REPLACE INTO queues (name, settings) VALUES (?1, ?2)"},
      {&delete_queue_, "DELETE FROM queues WHERE name = ?1"},
      {&insert_attempt_,
       "INSERT OR REPLACE INTO attempts (task_id, attempt, data) VALUES (?1, ?2, ?3)"},
      {&clear_attempts_, "DELETE FROM attempts WHERE task_id = ?1"},
      {&trim_attempts_, "DELETE FROM attempts WHERE task_id = ?1 AND attempt < ?2"},
      {&insert_event_,
       "INSERT INTO events (task_id, queue, from_state, to_state, attempt, agent_id, time_us, "
       "reason, revision, job_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"},
      {&prune_events_, "DELETE FROM events WHERE revision <= ?1"},
      {&note_pruned_,
       "INSERT INTO meta (key, value) VALUES ('newest_pruned_revision', ?1) "
       "ON CONFLICT (key) DO UPDATE SET value = max(value, excluded.value)"},
      {&put_schedule_,
       "INSERT OR REPLACE INTO schedules (id, definition, paused, next_fire_us, last_fire_us, "
       "last_task_id, fire_count, last_error, create_us, update_us) "
       "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"},
      {&delete_schedule_, "DELETE FROM schedules WHERE id = ?1"},
  };
  for (auto& s : stmts) {
    if (sqlite3_prepare_v3(db_, s.sql, -1, SQLITE_PREPARE_PERSISTENT, s.st, nullptr) != SQLITE_OK) {
      return SqlError(db_, absl::StrCat("preparing ", s.sql));
    }
  }
  return absl::OkStatus();
}

absl::Status SqliteStore::StartCheckpointer(Durability durability) {
  if (sqlite3_open_v2(db_path_.c_str(), &ckpt_db_, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
    return SqlError(ckpt_db_, "cannot open the checkpoint connection");
  }
  sqlite3_busy_timeout(ckpt_db_, 5000);
  // Its own syncs (the database file after copying pages back) follow the
  // same durability as the commits.
  if (absl::Status s =
          Exec(ckpt_db_, durability == Durability::kFull ? "PRAGMA synchronous=FULL"
                                                         : "PRAGMA synchronous=NORMAL");
      !s.ok()) {
    return s;
  }
  // Replaces SQLite's automatic checkpoint, which ran inside the commit
  // that crossed 1,000 WAL pages: copying pages back and syncing the
  // database file then held up every caller of that commit.
  sqlite3_wal_hook(db_, &SqliteStore::WalHook, this);
  ckpt_thread_ = std::thread([this] { CheckpointLoop(); });
  return absl::OkStatus();
}

int SqliteStore::WalHook(void* self, sqlite3* db, const char* /*name*/, int pages) {
  auto* store = static_cast<SqliteStore*>(self);
  if (pages >= kWalForcePages) {
    // The checkpointer fell far behind (or readers kept it from finishing):
    // bound the WAL here, as SQLite's own automatic checkpoint would.
    sqlite3_wal_checkpoint_v2(db, nullptr, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
  } else if (pages >= kWalCheckpointPages) {
    std::lock_guard<std::mutex> lock(store->ckpt_mu_);
    store->ckpt_wanted_ = true;
    store->ckpt_cv_.notify_one();
  }
  return SQLITE_OK;
}

void SqliteStore::CheckpointLoop() {
  std::unique_lock<std::mutex> lock(ckpt_mu_);
  for (;;) {
    ckpt_cv_.wait(lock, [this] { return ckpt_stop_ || ckpt_wanted_; });
    if (ckpt_stop_) return;
    ckpt_wanted_ = false;
    lock.unlock();
    // PASSIVE: copies what no reader still needs, never waits for or blocks
    // the writer; the writer restarts the WAL from the top once it is all
    // copied back.
    if (sqlite3_wal_checkpoint_v2(ckpt_db_, nullptr, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr) ==
        SQLITE_OK) {
      ++ckpt_done_;
    }
    lock.lock();
  }
}

SqliteStore::~SqliteStore() {
  if (ckpt_thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(ckpt_mu_);
      ckpt_stop_ = true;
      ckpt_cv_.notify_one();
    }
    ckpt_thread_.join();
  }
  if (ckpt_db_ != nullptr) sqlite3_close(ckpt_db_);
  for (sqlite3_stmt* st :
       {begin_, commit_, rollback_, insert_task_, update_task_, insert_attempt_, clear_attempts_,
        trim_attempts_, insert_merged_, put_queue_, delete_queue_, insert_event_, prune_events_,
        note_pruned_, put_schedule_, delete_schedule_, delete_task_, delete_merged_}) {
    sqlite3_finalize(st);
  }
  sqlite3_finalize(read_events_);
  for (sqlite3_stmt* st : {read_task_, read_task_attempts_, read_task_merged_}) {
    sqlite3_finalize(st);
  }
  if (task_db_ != nullptr) sqlite3_close(task_db_);
  if (read_db_ != nullptr) sqlite3_close(read_db_);
  if (db_ != nullptr) sqlite3_close(db_);
  if (lock_fd_ >= 0) close(lock_fd_);  // releases the flock
}

absl::Status SqliteStore::Apply(const core::WriteBatch& batch) {
  if (batch.empty()) return absl::OkStatus();
  if (absl::Status s = Step(db_, begin_, "beginning a transaction"); !s.ok()) return s;
  absl::Status s = ApplyLocked(batch);
  if (s.ok()) s = Step(db_, commit_, "committing");
  if (!s.ok()) Step(db_, rollback_, "rolling back").IgnoreError();
  return s;
}

absl::Status SqliteStore::ApplyLocked(const core::WriteBatch& batch) {
  // Each task row carries every status column, so a task changed several
  // times in one transaction (a short task's RUNNING and SUCCEEDED usually
  // commit together) needs only its last row written; an insert in the
  // batch is written with that last status.
  for (const core::TaskDelete& d : batch.deletes) {
    sqlite3_bind_int64(delete_task_, 1, d.seq);
    BindText(delete_task_, 2, d.id);
    if (absl::Status s = Step(db_, delete_task_, absl::StrCat("deleting task ", d.id)); !s.ok()) {
      return s;
    }
    if (sqlite3_changes(db_) != 1) {
      return absl::NotFoundError(absl::StrCat("deleting task ", d.id, ": no such row"));
    }
    BindText(clear_attempts_, 1, d.id);
    if (absl::Status s = Step(db_, clear_attempts_, "deleting attempts"); !s.ok()) return s;
    BindText(delete_merged_, 1, d.id);
    if (absl::Status s = Step(db_, delete_merged_, "deleting merged payloads"); !s.ok()) return s;
  }
  absl::flat_hash_map<int64_t, size_t> last;
  if (batch.tasks.size() > 1) {
    last.reserve(batch.tasks.size());
    for (size_t i = 0; i < batch.tasks.size(); ++i) last[batch.tasks[i].seq] = i;
  }
  for (size_t i = 0; i < batch.tasks.size(); ++i) {
    const core::TaskRow& r = batch.tasks[i];
    const core::TaskRow& now = last.empty() ? r : batch.tasks[last[r.seq]];
    if (r.insert) {
      sqlite3_stmt* st = insert_task_;
      BindText(st, 1, r.id);
      sqlite3_bind_int64(st, 2, r.seq);
      BindText(st, 3, r.queue);
      sqlite3_bind_int(st, 4, now.state);
      sqlite3_bind_int(st, 5, now.attempt);
      BindText(st, 6, now.agent_id);
      sqlite3_bind_int64(st, 7, r.create_us);
      sqlite3_bind_int64(st, 8, now.update_us);
      sqlite3_bind_int64(st, 9, now.next_run_us);
      sqlite3_bind_int64(st, 10, now.dispatch_us);
      sqlite3_bind_int64(st, 11, now.start_us);
      BindText(st, 12, now.reason);
      BindBlob(st, 13, now.result);
      BindBlob(st, 14, r.spec);
      sqlite3_bind_int(st, 15, now.pause_requested ? 1 : 0);
      BindText(st, 16, r.job_id);
      sqlite3_bind_int(st, 17, now.attempt_base);
      sqlite3_bind_int(st, 18, now.attempts_dropped);
      sqlite3_bind_int(st, 19, now.interrupted_dropped);
      sqlite3_bind_int64(st, 20, now.claim_until_us);
      sqlite3_bind_int64(st, 21, now.merge_fire_us);
      BindText(st, 22, r.unique_key);
      sqlite3_bind_int64(st, 23, now.unique_until_us);
      sqlite3_bind_int(st, 24, FamilyOf(r.replica, r.has_replicas));
      BindText(st, 25, r.labels);
      if (absl::Status s = Step(db_, st, absl::StrCat("inserting task ", r.id)); !s.ok()) return s;
    } else if (&now == &r) {
      sqlite3_stmt* st = update_task_;
      BindText(st, 1, r.id);
      sqlite3_bind_int(st, 2, r.state);
      sqlite3_bind_int(st, 3, r.attempt);
      BindText(st, 4, r.agent_id);
      sqlite3_bind_int64(st, 5, r.update_us);
      sqlite3_bind_int64(st, 6, r.next_run_us);
      sqlite3_bind_int64(st, 7, r.dispatch_us);
      sqlite3_bind_int64(st, 8, r.start_us);
      BindText(st, 9, r.reason);
      BindBlob(st, 10, r.result);
      sqlite3_bind_int(st, 11, r.pause_requested ? 1 : 0);
      sqlite3_bind_int(st, 12, r.attempt_base);
      sqlite3_bind_int64(st, 13, r.seq);
      sqlite3_bind_int(st, 14, r.attempts_dropped);
      sqlite3_bind_int(st, 15, r.interrupted_dropped);
      sqlite3_bind_int64(st, 16, r.claim_until_us);
      sqlite3_bind_int64(st, 17, r.merge_fire_us);
      sqlite3_bind_int64(st, 18, r.unique_until_us);
      if (absl::Status s = Step(db_, st, absl::StrCat("updating task ", r.id)); !s.ok()) return s;
      if (sqlite3_changes(db_) != 1) {
        return absl::NotFoundError(absl::StrCat("updating task ", r.id, ": no such row"));
      }
    }
  }
  for (const core::MergedRow& m : batch.merged) {
    BindText(insert_merged_, 1, m.task_id);
    sqlite3_bind_int(insert_merged_, 2, m.n);
    BindBlob(insert_merged_, 3, m.payload);
    if (absl::Status s = Step(db_, insert_merged_, "inserting a merged payload"); !s.ok()) return s;
  }
  for (const core::QueueRow& q : batch.queues) {
    if (q.settings.empty()) {
      BindText(delete_queue_, 1, q.queue);
      if (absl::Status s = Step(db_, delete_queue_, "deleting queue settings"); !s.ok()) return s;
    } else {
      BindText(put_queue_, 1, q.queue);
      BindBlob(put_queue_, 2, q.settings);
      if (absl::Status s = Step(db_, put_queue_, "storing queue settings"); !s.ok()) return s;
    }
  }
  for (const std::string& id : batch.clear_attempts) {
    BindText(clear_attempts_, 1, id);
    if (absl::Status s = Step(db_, clear_attempts_, "clearing attempts"); !s.ok()) return s;
  }
  for (const core::AttemptRow& a : batch.attempts) {
    BindText(insert_attempt_, 1, a.task_id);
    sqlite3_bind_int(insert_attempt_, 2, a.attempt);
    BindBlob(insert_attempt_, 3, a.data);
    if (absl::Status s = Step(db_, insert_attempt_, "inserting an attempt"); !s.ok()) return s;
  }
  for (const auto& [id, below] : batch.trim_attempts) {
    BindText(trim_attempts_, 1, id);
    sqlite3_bind_int(trim_attempts_, 2, below);
    if (absl::Status s = Step(db_, trim_attempts_, "trimming attempts"); !s.ok()) return s;
  }
  for (const core::EventRow& e : batch.events) {
    sqlite3_stmt* st = insert_event_;
    BindText(st, 1, e.task_id);
    BindText(st, 2, e.queue);
    sqlite3_bind_int(st, 3, e.from_state);
    sqlite3_bind_int(st, 4, e.to_state);
    sqlite3_bind_int(st, 5, e.attempt);
    BindText(st, 6, e.agent_id);
    sqlite3_bind_int64(st, 7, e.time_us);
    BindText(st, 8, e.reason);
    sqlite3_bind_int64(st, 9, e.revision);
    BindText(st, 10, e.job_id);
    if (absl::Status s = Step(db_, st, "inserting an event"); !s.ok()) return s;
  }
  for (const core::ScheduleRow& r : batch.schedules) {
    if (r.erase) {
      BindText(delete_schedule_, 1, r.id);
      if (absl::Status s = Step(db_, delete_schedule_, "deleting a schedule"); !s.ok()) return s;
      continue;
    }
    sqlite3_stmt* st = put_schedule_;
    BindText(st, 1, r.id);
    BindBlob(st, 2, r.definition);
    sqlite3_bind_int(st, 3, r.paused ? 1 : 0);
    sqlite3_bind_int64(st, 4, r.next_fire_us);
    sqlite3_bind_int64(st, 5, r.last_fire_us);
    BindText(st, 6, r.last_task_id);
    sqlite3_bind_int64(st, 7, r.fire_count);
    BindText(st, 8, r.last_error);
    sqlite3_bind_int64(st, 9, r.create_us);
    sqlite3_bind_int64(st, 10, r.update_us);
    if (absl::Status s = Step(db_, st, absl::StrCat("writing schedule ", r.id)); !s.ok()) return s;
  }
  if (batch.prune_events_through > 0) {
    sqlite3_bind_int64(prune_events_, 1, batch.prune_events_through);
    if (absl::Status s = Step(db_, prune_events_, "pruning events"); !s.ok()) return s;
    sqlite3_bind_int64(note_pruned_, 1, batch.prune_events_through);
    if (absl::Status s = Step(db_, note_pruned_, "noting the pruned revision"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> SqliteStore::CountTasks() {
  ASSIGN_OR_RETURN(const Statement stmt,
                   sqlite::Prepare(db_, "SELECT count(*) FROM tasks", "counting tasks"));
  sqlite3_stmt* const st = stmt.get();
  const int rc = sqlite3_step(st);
  const int64_t n = rc == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
  if (rc != SQLITE_ROW) return SqlError(db_, "counting tasks");
  return n;
}

absl::Status SqliteStore::ScanTasks(const RowSink& sink, bool light_finished) {
  // A read-only connection of its own, used by this call only: opened
  // without SQLite's mutex, which in serialized mode is taken in every
  // column read (13 % of reading back 1,000,000 tasks), and safe beside the
  // writer (WAL readers see the last commit).
  sqlite3* raw = nullptr;
  const int open_rc =
      sqlite3_open_v2(db_path_.c_str(), &raw, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, nullptr);
  const std::unique_ptr<sqlite3, int (*)(sqlite3*)> db(raw, sqlite3_close);
  if (open_rc != SQLITE_OK) return SqlError(db.get(), "opening a connection to load tasks");
  sqlite3_busy_timeout(db.get(), 5000);
  ASSIGN_OR_RETURN(
      const Statement stmt,
      sqlite::Prepare(db.get(),
                      absl::StrCat("SELECT ", kTaskColumns, " FROM tasks ORDER BY seq").c_str(),
                      "loading tasks"));
  sqlite3_stmt* const st = stmt.get();
  std::vector<core::TaskRow> rows(kScanChunkRows);
  size_t n = 0;
  absl::Status status;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    ReadRow(st, light_finished, &rows[n++]);
    if (n == kScanChunkRows) {
      status = sink(&rows);
      if (!status.ok()) break;
      rows.resize(kScanChunkRows);  // the sink may have swapped the vector
      n = 0;
    }
  }
  if (!status.ok()) return status;
  if (rc != SQLITE_DONE) return SqlError(db.get(), "loading tasks");
  if (n > 0) {
    rows.resize(n);
    return sink(&rows);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<core::AttemptRow>> SqliteStore::LoadAttempts() {
  ASSIGN_OR_RETURN(
      const Statement stmt,
      sqlite::Prepare(db_, "SELECT task_id, attempt, data FROM attempts ORDER BY task_id, attempt",
                      "loading attempts"));
  sqlite3_stmt* const st = stmt.get();
  std::vector<core::AttemptRow> out;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    core::AttemptRow& a = out.emplace_back();
    a.task_id = ColumnString(st, 0);
    a.attempt = sqlite3_column_int(st, 1);
    a.data = ColumnString(st, 2);
  }
  if (rc != SQLITE_DONE) return SqlError(db_, "loading attempts");
  return out;
}

absl::StatusOr<std::vector<core::MergedRow>> SqliteStore::LoadMerged() {
  ASSIGN_OR_RETURN(
      const Statement stmt,
      sqlite::Prepare(db_, "SELECT task_id, n, payload FROM merged ORDER BY task_id, n",
                      "loading merged payloads"));
  sqlite3_stmt* const st = stmt.get();
  std::vector<core::MergedRow> out;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    core::MergedRow& m = out.emplace_back();
    m.task_id = ColumnString(st, 0);
    m.n = sqlite3_column_int(st, 1);
    m.payload = ColumnString(st, 2);
  }
  if (rc != SQLITE_DONE) return SqlError(db_, "loading merged payloads");
  return out;
}

absl::Status SqliteStore::ReadHistoryLocked(const std::string& task_id,
                                            std::vector<core::AttemptRow>* attempts,
                                            std::vector<core::MergedRow>* merged) {
  BindText(read_task_attempts_, 1, task_id);
  int arc;
  while ((arc = sqlite3_step(read_task_attempts_)) == SQLITE_ROW) {
    core::AttemptRow& a = attempts->emplace_back();
    a.task_id = task_id;
    a.attempt = sqlite3_column_int(read_task_attempts_, 0);
    a.data = ColumnString(read_task_attempts_, 1);
  }
  sqlite3_reset(read_task_attempts_);
  BindText(read_task_merged_, 1, task_id);
  int mrc;
  while ((mrc = sqlite3_step(read_task_merged_)) == SQLITE_ROW) {
    core::MergedRow& m = merged->emplace_back();
    m.task_id = task_id;
    m.n = sqlite3_column_int(read_task_merged_, 0);
    m.payload = ColumnString(read_task_merged_, 1);
  }
  sqlite3_reset(read_task_merged_);
  if (arc != SQLITE_DONE || mrc != SQLITE_DONE) {
    return SqlError(task_db_, "reading a task's attempts and payloads");
  }
  return absl::OkStatus();
}

absl::Status SqliteStore::ReadHistory(const std::vector<std::string>& task_ids,
                                      std::vector<core::AttemptRow>* attempts,
                                      std::vector<core::MergedRow>* merged) {
  std::lock_guard<std::mutex> lock(task_mu_);
  if (task_ids.empty()) return absl::OkStatus();
  if (absl::Status s = Exec(task_db_, "BEGIN"); !s.ok()) return s;
  absl::Status status;
  for (const std::string& id : task_ids) {
    status = ReadHistoryLocked(id, attempts, merged);
    if (!status.ok()) break;
  }
  Exec(task_db_, "COMMIT").IgnoreError();
  return status;
}

absl::StatusOr<std::vector<core::StoredTask>> SqliteStore::ReadTasks(
    const std::vector<int64_t>& seqs) {
  std::lock_guard<std::mutex> lock(task_mu_);
  std::vector<core::StoredTask> out;
  if (seqs.empty()) return out;
  // One read transaction: the rows and their attempts as of one commit.
  if (absl::Status s = Exec(task_db_, "BEGIN"); !s.ok()) return s;
  absl::Status status;
  for (int64_t seq : seqs) {
    sqlite3_bind_int64(read_task_, 1, seq);
    const int rc = sqlite3_step(read_task_);
    if (rc == SQLITE_ROW) {
      core::StoredTask& t = out.emplace_back();
      ReadRow(read_task_, /*light_finished=*/false, &t.row);
    }
    sqlite3_reset(read_task_);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
      status = SqlError(task_db_, "reading a task");
      break;
    }
    if (rc == SQLITE_DONE) continue;
    core::StoredTask& t = out.back();
    status = ReadHistoryLocked(t.row.id, &t.attempts, &t.merged);
    if (!status.ok()) break;
  }
  Exec(task_db_, "COMMIT").IgnoreError();
  if (!status.ok()) return status;
  return out;
}

absl::StatusOr<std::vector<core::QueueRow>> SqliteStore::LoadQueues() {
  ASSIGN_OR_RETURN(const Statement stmt,
                   sqlite::Prepare(db_, "SELECT name, settings FROM queues ORDER BY name",
                                   "loading queue settings"));
  sqlite3_stmt* const st = stmt.get();
  std::vector<core::QueueRow> out;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    core::QueueRow& q = out.emplace_back();
    q.queue = ColumnString(st, 0);
    q.settings = ColumnString(st, 1);
  }
  if (rc != SQLITE_DONE) return SqlError(db_, "loading queue settings");
  return out;
}

absl::StatusOr<std::vector<core::ScheduleRow>> SqliteStore::LoadSchedules() {
  ASSIGN_OR_RETURN(
      const Statement stmt,
      sqlite::Prepare(db_,
                      "SELECT id, definition, paused, next_fire_us, last_fire_us, last_task_id, "
                      "fire_count, last_error, create_us, update_us FROM schedules ORDER BY id",
                      "loading schedules"));
  sqlite3_stmt* const st = stmt.get();
  std::vector<core::ScheduleRow> out;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    core::ScheduleRow& r = out.emplace_back();
    r.id = ColumnString(st, 0);
    r.definition = ColumnString(st, 1);
    r.paused = sqlite3_column_int(st, 2) != 0;
    r.next_fire_us = sqlite3_column_int64(st, 3);
    r.last_fire_us = sqlite3_column_int64(st, 4);
    r.last_task_id = ColumnString(st, 5);
    r.fire_count = sqlite3_column_int64(st, 6);
    r.last_error = ColumnString(st, 7);
    r.create_us = sqlite3_column_int64(st, 8);
    r.update_us = sqlite3_column_int64(st, 9);
  }
  if (rc != SQLITE_DONE) return SqlError(db_, "loading schedules");
  return out;
}

absl::StatusOr<std::vector<StoredEvent>> SqliteStore::ReadEvents(int64_t after, int limit) {
  std::lock_guard<std::mutex> lock(read_mu_);
  sqlite3_stmt* st = read_events_;
  sqlite3_bind_int64(st, 1, after);
  sqlite3_bind_int(st, 2, limit);
  std::vector<StoredEvent> out;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    StoredEvent ev;
    ev.revision = sqlite3_column_int64(st, 0);
    ev.event.task_id = ColumnString(st, 1);
    ev.event.queue = ColumnString(st, 2);
    ev.event.from_state = sqlite3_column_int(st, 3);
    ev.event.to_state = sqlite3_column_int(st, 4);
    ev.event.attempt = sqlite3_column_int(st, 5);
    ev.event.agent_id = ColumnString(st, 6);
    ev.event.time_us = sqlite3_column_int64(st, 7);
    ev.event.reason = ColumnString(st, 8);
    ev.event.job_id = ColumnString(st, 9);
    out.push_back(std::move(ev));
  }
  // Reset ends the read transaction, so the next call sees later commits.
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  if (rc != SQLITE_DONE) return SqlError(read_db_, "reading events");
  return out;
}

absl::StatusOr<EventSpan> SqliteStore::GetEventSpan() {
  std::lock_guard<std::mutex> lock(read_mu_);
  // One statement: one read transaction, so a prune between the parts
  // cannot be seen half.
  ASSIGN_OR_RETURN(const Statement stmt,
                   sqlite::Prepare(read_db_,
                                   "SELECT ifnull(min(revision), 0), ifnull(max(revision), 0), "
                                   "(SELECT ifnull(max(value), 0) FROM meta "
                                   "WHERE key = 'newest_pruned_revision') FROM events",
                                   "reading the event span"));
  sqlite3_stmt* const st = stmt.get();
  const int rc = sqlite3_step(st);
  EventSpan span;
  if (rc == SQLITE_ROW) {
    span.oldest = sqlite3_column_int64(st, 0);
    span.newest_pruned = sqlite3_column_int64(st, 2);
    span.newest = std::max<int64_t>(sqlite3_column_int64(st, 1), span.newest_pruned);
  }
  if (rc != SQLITE_ROW) return SqlError(read_db_, "reading the event span");
  return span;
}

}  // namespace taskgrid::store
