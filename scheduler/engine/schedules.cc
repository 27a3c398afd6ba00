// The Engine's side of ScheduleService: each call runs on the Scheduler
// under the Engine's mutex and is answered after its rows are committed,
// as the TaskService calls are. The fires themselves happen in the
// ticker's Tick and commit with it.

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "scheduler/engine/engine.h"

namespace taskgrid::engine {

void Engine::AnswerSchedule(absl::StatusOr<const core::ScheduleRecord*> s,
                            Reply<v1::Schedule> done) {
  absl::StatusOr<v1::Schedule> result;
  if (!s.ok()) {
    result = s.status();
  } else {
    v1::Schedule out;
    sched_.DescribeSchedule(**s, &out);
    result = std::move(out);
  }
  Answer(std::move(result), std::move(done));
}

void Engine::CreateSchedule(v1::CreateScheduleRequest req, Reply<v1::Schedule> done) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return done(Stopped());
  AnswerSchedule(sched_.CreateSchedule(std::move(*req.mutable_schedule())), std::move(done));
}

void Engine::GetSchedule(const std::string& id, Reply<v1::Schedule> done) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return done(Stopped());
  absl::StatusOr<const core::ScheduleRecord*> s;
  if (id.empty()) {
    s = absl::InvalidArgumentError("id is empty");
  } else if (const core::ScheduleRecord* found = sched_.FindSchedule(id)) {
    s = found;
  } else {
    s = absl::NotFoundError(absl::StrCat("schedule \"", id, "\" does not exist"));
  }
  // After the commits queued before it, as GetTask.
  AnswerSchedule(s, std::move(done));
}

void Engine::ListSchedules(const v1::ListSchedulesRequest& req,
                           Reply<v1::ListSchedulesResponse> done) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return done(Stopped());
  absl::StatusOr<v1::ListSchedulesResponse> result;
  if (req.page_size() < 0) {
    result = absl::InvalidArgumentError("page_size is negative");
  } else {
    const int size = req.page_size() == 0 ? 100 : std::min(req.page_size(), 1000);
    // One more than the page: whether another page follows.
    std::vector<const core::ScheduleRecord*> page =
        sched_.ListSchedules(req.page_token(), size + 1);
    v1::ListSchedulesResponse resp;
    const bool more = static_cast<int>(page.size()) > size;
    if (more) page.pop_back();
    for (const core::ScheduleRecord* s : page) sched_.DescribeSchedule(*s, resp.add_schedules());
    if (more) resp.set_next_page_token(page.back()->id());
    result = std::move(resp);
  }
  Answer(std::move(result), std::move(done));
}

void Engine::PauseSchedule(const std::string& id, Reply<v1::Schedule> done) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return done(Stopped());
  AnswerSchedule(sched_.PauseSchedule(id), std::move(done));
}

void Engine::ResumeSchedule(const std::string& id, Reply<v1::Schedule> done) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return done(Stopped());
  AnswerSchedule(sched_.ResumeSchedule(id), std::move(done));
}

void Engine::DeleteSchedule(const std::string& id, Reply<v1::Schedule> done) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return done(Stopped());
  absl::StatusOr<core::ScheduleRecord> gone = sched_.DeleteSchedule(id);
  absl::StatusOr<v1::Schedule> result;
  if (!gone.ok()) {
    result = gone.status();
  } else {
    v1::Schedule out;
    sched_.DescribeSchedule(*gone, &out);
    result = std::move(out);
  }
  Answer(std::move(result), std::move(done));
}

}  // namespace taskgrid::engine
