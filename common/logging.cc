#include "common/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "absl/synchronization/mutex.h"

namespace taskgrid {

void InitLogging(const std::string& process_name, const std::string& level) {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  auto logger = spdlog::stderr_color_mt(process_name);
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %n: %v");
  auto lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off") lvl = spdlog::level::info;
  spdlog::set_level(lvl);
  spdlog::flush_on(spdlog::level::info);
}

}  // namespace taskgrid
