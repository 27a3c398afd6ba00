// taskgrid-rpc-floor: the floor under one awaited SubmitTasks at a time.
//
// A server that does nothing but what every durable submit must do (take
// the request, write a commit's worth of bytes, fdatasync, answer) and a
// client that calls it one call at a time, in two processes on this machine.
// It shows what gRPC's server APIs and the disk cost before any scheduler
// work, so W1's one-at-a-time figure can be read against its real floor:
//
//   taskgrid-rpc-floor --server=callback --write_bytes=8192 --calls=20000
//   taskgrid-rpc-floor --server=callback --sqlite
//   taskgrid-rpc-floor --server=callback --log
//
// --server picks the API: callback (what the scheduler serves with), sync
// (gRPC's thread-per-call pool) or cq (the completion-queue API, one thread
// of our own polling it). --write_bytes=0 leaves the disk out; --sqlite
// commits a task row and an event row through SQLite with the scheduler's
// settings instead; --log appends to a log of our own and flushes that, with
// SQLite written behind it. docs/performance.md has what it measured here.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "taskgrid/v1/task_service.grpc.pb.h"

ABSL_FLAG(std::string, server, "callback", "Server API: callback, sync or cq");
ABSL_FLAG(int64_t, calls, 20000, "Calls timed, one at a time, after 1,000 untimed");
ABSL_FLAG(int64_t, write_bytes, 8192,
          "Bytes the server writes and fdatasyncs per call (0: no disk; not with --sqlite)");
ABSL_FLAG(std::string, dir, "", "Directory of the server's file (default: $TMPDIR, else /tmp)");
ABSL_FLAG(int32_t, payload_bytes, 100, "Payload bytes of each submitted task");
ABSL_FLAG(bool, sqlite, false,
          "Commit a task row and an event row per call to an SQLite database in WAL mode "
          "(synchronous=FULL, checkpoints on a thread of their own, as the scheduler does) "
          "instead of --write_bytes");
ABSL_FLAG(bool, log, false,
          "Append each task to a log file of our own and fdatasync it, SQLite written behind "
          "it on another thread without flushes: what a commit path in front of SQLite would "
          "cost (instead of --write_bytes)");

namespace v1 = taskgrid::v1;

namespace {

using Specs = google::protobuf::RepeatedPtrField<v1::TaskSpec>;

// What a call makes durable before it is answered: one of the disks below.
class Store {
 public:
  virtual ~Store() = default;
  virtual bool Commit(const Specs& specs) = 0;
};

// A write at the next offset of a preallocated file (so fdatasync has no
// size to commit, as with SQLite's reused WAL) and the flush; nothing at
// all for 0 bytes.
class Disk final : public Store {
 public:
  Disk(const std::string& dir, int64_t bytes)
      : bytes_(bytes), buf_(static_cast<size_t>(bytes), 'w') {
    if (bytes_ <= 0) return;
    path_ = absl::StrCat(dir, "/taskgrid-rpc-floor-", getpid());
    fd_ = open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    // Unlinked at once: the server is killed, not stopped.
    if (fd_ < 0 || unlink(path_.c_str()) != 0 || ftruncate(fd_, bytes_ * kSlots) != 0 ||
        fsync(fd_) != 0) {
      std::fprintf(stderr, "cannot prepare %s: %s\n", path_.c_str(), std::strerror(errno));
      std::exit(1);
    }
  }
  ~Disk() override {
    if (fd_ >= 0) close(fd_);
  }
  bool Commit(const Specs&) override {
    if (bytes_ <= 0) return true;
    const off_t at = static_cast<off_t>(next_++ % kSlots) * bytes_;
    return pwrite(fd_, buf_.data(), buf_.size(), at) == static_cast<ssize_t>(buf_.size()) &&
           fdatasync(fd_) == 0;
  }

 private:
  static constexpr int64_t kSlots = 1000;
  int64_t bytes_;
  std::string buf_;
  std::string path_;
  int fd_ = -1;
  int64_t next_ = 0;
};

// The scheduler's SQLite settings without the scheduler: a task row and an
// event row per commit, prepared statements, the WAL checkpointed by a
// second connection on its own thread once it passes 1,000 pages (the
// store's kWalCheckpointPages).
class SqliteDisk final : public Store {
 public:
  // `flushed`: synchronous=FULL (the durability point); else OFF (behind
  // a log that is).
  SqliteDisk(const std::string& dir, bool flushed) : flushed_(flushed) {
    path_ = absl::StrCat(dir, "/taskgrid-rpc-floor-", getpid(), ".db");
    db_ = Open();
    Exec(db_,
         "CREATE TABLE tasks (seq INTEGER PRIMARY KEY, id TEXT NOT NULL, queue TEXT NOT NULL, "
         "state INTEGER NOT NULL, spec BLOB NOT NULL)");
    Exec(db_,
         "CREATE TABLE events (revision INTEGER PRIMARY KEY, task_id TEXT NOT NULL, "
         "kind INTEGER NOT NULL, at INTEGER NOT NULL)");
    Prepare("BEGIN", &begin_);
    Prepare("COMMIT", &commit_);
    Prepare("INSERT INTO tasks VALUES (?, ?, 'floor', 0, ?)", &task_);
    Prepare("INSERT INTO events VALUES (?, ?, 1, ?)", &event_);
    sqlite3_wal_hook(db_, &SqliteDisk::WalHook, this);
    checkpointer_ = std::thread([this] { Checkpoints(); });
  }
  ~SqliteDisk() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    checkpointer_.join();
    for (sqlite3_stmt* st : {begin_, commit_, task_, event_}) sqlite3_finalize(st);
    sqlite3_close(db_);
  }
  bool Commit(const Specs& specs) override { return CommitRows(specs); }
  // One transaction: a task row and an event row per spec.
  template <typename List>
  bool CommitRows(const List& specs) {
    bool ok = Step(begin_);
    for (const v1::TaskSpec& spec : specs) {
      if (!ok) break;
      const int64_t seq = ++seq_;
      const std::string blob = spec.SerializeAsString();
      sqlite3_bind_int64(task_, 1, seq);
      sqlite3_bind_text(task_, 2, spec.id().data(), static_cast<int>(spec.id().size()),
                        SQLITE_STATIC);
      sqlite3_bind_blob(task_, 3, blob.data(), static_cast<int>(blob.size()), SQLITE_STATIC);
      ok = Step(task_);
      sqlite3_bind_int64(event_, 1, seq);
      sqlite3_bind_text(event_, 2, spec.id().data(), static_cast<int>(spec.id().size()),
                        SQLITE_STATIC);
      sqlite3_bind_int64(event_, 3, absl::ToUnixMicros(absl::Now()));
      ok = ok && Step(event_);
    }
    return Step(commit_) && ok;
  }

 private:
  sqlite3* Open() {
    sqlite3* db = nullptr;
    if (sqlite3_open(path_.c_str(), &db) != SQLITE_OK) {
      std::fprintf(stderr, "cannot open %s\n", path_.c_str());
      std::exit(1);
    }
    Exec(db, "PRAGMA journal_mode=WAL");
    Exec(db, flushed_ ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=OFF");
    Exec(db, "PRAGMA wal_autocheckpoint=0");
    sqlite3_busy_timeout(db, 10000);
    return db;
  }
  static void Exec(sqlite3* db, const char* sql) {
    char* err = nullptr;
    if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
      std::fprintf(stderr, "%s: %s\n", sql, err != nullptr ? err : "?");
      std::exit(1);
    }
  }
  void Prepare(const char* sql, sqlite3_stmt** st) {
    if (sqlite3_prepare_v3(db_, sql, -1, SQLITE_PREPARE_PERSISTENT, st, nullptr) != SQLITE_OK) {
      std::fprintf(stderr, "%s: %s\n", sql, sqlite3_errmsg(db_));
      std::exit(1);
    }
  }
  static bool Step(sqlite3_stmt* st) {
    const int rc = sqlite3_step(st);
    sqlite3_reset(st);
    return rc == SQLITE_DONE;
  }
  static int WalHook(void* self, sqlite3*, const char*, int pages) {
    auto* d = static_cast<SqliteDisk*>(self);
    if (pages >= 1000) {
      {
        std::lock_guard<std::mutex> l(d->mu_);
        d->wanted_ = true;
      }
      d->cv_.notify_one();
    }
    return SQLITE_OK;
  }
  void Checkpoints() {
    sqlite3* db = Open();
    std::unique_lock<std::mutex> l(mu_);
    while (true) {
      cv_.wait(l, [&] { return stop_ || wanted_; });
      if (stop_) break;
      wanted_ = false;
      l.unlock();
      sqlite3_wal_checkpoint_v2(db, nullptr, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
      l.lock();
    }
    sqlite3_close(db);
  }

  const bool flushed_;
  std::string path_;
  sqlite3* db_ = nullptr;
  sqlite3_stmt* begin_ = nullptr;
  sqlite3_stmt* commit_ = nullptr;
  sqlite3_stmt* task_ = nullptr;
  sqlite3_stmt* event_ = nullptr;
  int64_t seq_ = 0;
  std::thread checkpointer_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool wanted_ = false;
  bool stop_ = false;
};

// A log of our own as the durability point: each commit appends the
// task (length-prefixed) to a file written with zeros up front (so a
// flush commits no size or block allocation) and flushes it; a thread
// writes what was flushed into SQLite behind it, without flushes. The
// answer waits for the log only.
class LogDisk final : public Store {
 public:
  explicit LogDisk(const std::string& dir) : db_(dir, /*flushed=*/false) {
    const std::string path = absl::StrCat(dir, "/taskgrid-rpc-floor-", getpid(), ".log");
    fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
    const std::string zeros(1 << 20, '\0');
    bool ok = fd_ >= 0 && unlink(path.c_str()) == 0;
    for (off_t at = 0; ok && at < kBytes; at += static_cast<off_t>(zeros.size())) {
      ok = pwrite(fd_, zeros.data(), zeros.size(), at) == static_cast<ssize_t>(zeros.size());
    }
    if (!ok || fsync(fd_) != 0) {
      std::fprintf(stderr, "cannot prepare %s: %s\n", path.c_str(), std::strerror(errno));
      std::exit(1);
    }
    applier_ = std::thread([this] { Apply(); });
  }
  ~LogDisk() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    applier_.join();
    close(fd_);
  }
  bool Commit(const Specs& specs) override {
    for (const v1::TaskSpec& spec : specs) {
      if (!Append(spec)) return false;
    }
    return true;
  }

 private:
  bool Append(const v1::TaskSpec& spec) {
    std::string record(4, '\0');
    spec.AppendToString(&record);
    const uint32_t n = static_cast<uint32_t>(record.size() - 4);
    std::memcpy(record.data(), &n, 4);
    if (at_ + static_cast<off_t>(record.size()) > kBytes) at_ = 0;  // wraps, as a WAL restarts
    const bool ok =
        pwrite(fd_, record.data(), record.size(), at_) == static_cast<ssize_t>(record.size()) &&
        fdatasync(fd_) == 0;
    at_ += static_cast<off_t>(record.size());
    if (ok) {
      std::lock_guard<std::mutex> l(mu_);
      queued_.push_back(spec);
    }
    cv_.notify_one();
    return ok;
  }
  void Apply() {
    std::vector<v1::TaskSpec> batch;
    std::unique_lock<std::mutex> l(mu_);
    while (true) {
      cv_.wait(l, [&] { return stop_ || !queued_.empty(); });
      if (queued_.empty()) break;
      batch.swap(queued_);
      l.unlock();
      db_.CommitRows(batch);
      batch.clear();
      l.lock();
    }
  }

  static constexpr off_t kBytes = 64 << 20;
  SqliteDisk db_;
  int fd_ = -1;
  off_t at_ = 0;
  std::thread applier_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1::TaskSpec> queued_;
  bool stop_ = false;
};

// Commits the tasks, then answers with them echoed back.
grpc::Status Handle(Store& store, const v1::SubmitTasksRequest& req,
                    v1::SubmitTasksResponse* resp) {
  if (!store.Commit(req.tasks())) return grpc::Status(grpc::StatusCode::INTERNAL, "commit failed");
  for (const v1::TaskSpec& spec : req.tasks()) {
    v1::Task* t = resp->add_tasks();
    *t->mutable_spec() = spec;
    t->set_state(v1::TASK_STATE_PENDING);
  }
  return grpc::Status::OK;
}

class CallbackImpl final : public v1::TaskService::CallbackService {
 public:
  explicit CallbackImpl(Store* store) : store_(store) {}
  grpc::ServerUnaryReactor* SubmitTasks(grpc::CallbackServerContext* ctx,
                                        const v1::SubmitTasksRequest* req,
                                        v1::SubmitTasksResponse* resp) override {
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    r->Finish(Handle(*store_, *req, resp));
    return r;
  }

 private:
  Store* store_;
};

class SyncImpl final : public v1::TaskService::Service {
 public:
  explicit SyncImpl(Store* store) : store_(store) {}
  grpc::Status SubmitTasks(grpc::ServerContext*, const v1::SubmitTasksRequest* req,
                           v1::SubmitTasksResponse* resp) override {
    return Handle(*store_, *req, resp);
  }

 private:
  Store* store_;
};

// The completion-queue API with one thread of ours: it asks for a call,
// handles it where it arrives, finishes it and asks for the next.
void ServeCq(v1::TaskService::AsyncService* svc, grpc::ServerCompletionQueue* cq, Store* store) {
  struct Call {
    grpc::ServerContext ctx;
    v1::SubmitTasksRequest req;
    v1::SubmitTasksResponse resp;
    grpc::ServerAsyncResponseWriter<v1::SubmitTasksResponse> writer{&ctx};
    bool finishing = false;
  };
  auto ask = [&] {
    auto* c = new Call;
    svc->RequestSubmitTasks(&c->ctx, &c->req, &c->writer, cq, cq, c);
  };
  ask();
  void* tag;
  bool ok;
  while (cq->Next(&tag, &ok)) {
    auto* c = static_cast<Call*>(tag);
    if (c->finishing || !ok) {
      delete c;
      continue;
    }
    ask();
    c->finishing = true;
    c->writer.Finish(c->resp, Handle(*store, c->req, &c->resp), c);
  }
}

[[noreturn]] void Serve(const std::string& api, int port_pipe) {
  const std::string dir = absl::GetFlag(FLAGS_dir);
  std::unique_ptr<Store> store;
  if (absl::GetFlag(FLAGS_sqlite)) {
    store = std::make_unique<SqliteDisk>(dir, /*flushed=*/true);
  } else if (absl::GetFlag(FLAGS_log)) {
    store = std::make_unique<LogDisk>(dir);
  } else {
    store = std::make_unique<Disk>(dir, absl::GetFlag(FLAGS_write_bytes));
  }
  CallbackImpl callback(store.get());
  SyncImpl sync(store.get());
  v1::TaskService::AsyncService async;
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  std::unique_ptr<grpc::ServerCompletionQueue> cq;
  if (api == "callback") {
    b.RegisterService(&callback);
  } else if (api == "sync") {
    b.RegisterService(&sync);
  } else {
    b.RegisterService(&async);
    cq = b.AddCompletionQueue();
  }
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  if (server == nullptr || write(port_pipe, &port, sizeof port) != sizeof port) _exit(1);
  close(port_pipe);
  if (cq != nullptr) {
    std::thread t(ServeCq, &async, cq.get(), store.get());
    t.join();
  }
  server->Wait();
  _exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "The floor under one awaited SubmitTasks at a time: a server that only writes, flushes "
      "and answers, called one call at a time.\n  taskgrid-rpc-floor --server=callback "
      "--write_bytes=8192");
  absl::ParseCommandLine(argc, argv);
  const std::string api = absl::GetFlag(FLAGS_server);
  if (api != "callback" && api != "sync" && api != "cq") {
    std::fprintf(stderr, "--server must be callback, sync or cq, not '%s'\n", api.c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_calls) <= 0 || absl::GetFlag(FLAGS_write_bytes) < 0 ||
      absl::GetFlag(FLAGS_payload_bytes) < 0) {
    std::fprintf(stderr,
                 "--calls must be positive; --write_bytes and --payload_bytes not negative\n");
    return 2;
  }
  if (absl::GetFlag(FLAGS_sqlite) && absl::GetFlag(FLAGS_log)) {
    std::fprintf(stderr, "--sqlite and --log are two disks: pick one\n");
    return 2;
  }
  if (absl::GetFlag(FLAGS_dir).empty()) {
    const char* t = getenv("TMPDIR");
    absl::SetFlag(&FLAGS_dir, t != nullptr && *t != '\0' ? t : "/tmp");
  }
  // The server is a child forked before gRPC starts in either process.
  int fds[2];
  if (pipe(fds) != 0) return 1;
  const pid_t child = fork();
  if (child < 0) return 1;
  if (child == 0) {
    close(fds[0]);
    Serve(api, fds[1]);
  }
  close(fds[1]);
  int port = 0;
  const bool got = read(fds[0], &port, sizeof port) == sizeof port;
  close(fds[0]);
  int rc = 0;
  if (!got) {
    std::fprintf(stderr, "the server did not start\n");
    rc = 1;
  } else {
    auto stub = v1::TaskService::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
    const int64_t calls = absl::GetFlag(FLAGS_calls);
    const std::string payload(static_cast<size_t>(absl::GetFlag(FLAGS_payload_bytes)), 'x');
    absl::Time t0;
    for (int64_t i = -1000; i < calls && rc == 0; ++i) {
      if (i == 0) t0 = absl::Now();
      v1::SubmitTasksRequest req;
      v1::TaskSpec* t = req.add_tasks();
      t->set_id(absl::StrCat("floor-", i + 1000));
      t->set_queue("floor");
      t->add_steps()->mutable_builtin()->set_name("noop");
      t->set_payload(payload);
      v1::SubmitTasksResponse resp;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      const grpc::Status s = stub->SubmitTasks(&ctx, req, &resp);
      if (!s.ok()) {
        std::fprintf(stderr, "call %lld: %s\n", static_cast<long long>(i),
                     s.error_message().c_str());
        rc = 1;
      }
    }
    if (rc == 0) {
      const double secs = absl::ToDoubleSeconds(absl::Now() - t0);
      std::printf("server=%s %s: %lld calls in %.2f s, %.0f /s, %.1f us a call\n", api.c_str(),
                  absl::GetFlag(FLAGS_sqlite) ? "sqlite"
                  : absl::GetFlag(FLAGS_log)
                      ? "log"
                      : absl::StrCat("write_bytes=", absl::GetFlag(FLAGS_write_bytes)).c_str(),
                  static_cast<long long>(calls), secs, calls / secs, secs * 1e6 / calls);
    }
  }
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  for (const char* suffix : {".db", ".db-wal", ".db-shm"}) {
    unlink(absl::StrCat(absl::GetFlag(FLAGS_dir), "/taskgrid-rpc-floor-", child, suffix).c_str());
  }
  return rc;
}
