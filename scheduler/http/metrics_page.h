// The scheduler's /metrics page: an EngineMetrics snapshot written in the
// Prometheus text exposition format (common/prometheus.h). Every metric
// the scheduler exposes is named here, once; docs/dashboard-and-metrics.md's
// "Metrics" section lists them.
//
// gRPC-free and thread-free: a pure function of the snapshot.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "common/prometheus.h"
#include "scheduler/engine/engine.h"

namespace taskgrid::http {

// Process-wide facts the page shows beside the snapshot.
struct ProcessInfo {
  absl::Time start_time = absl::UnixEpoch();
  // CPU, memory and file descriptors (ReadProcessStats); without them the
  // page has only process_start_time_seconds of the process families.
  std::optional<prometheus::ProcessStats> stats;
  // gRPC calls answered, by method ("/taskgrid.v1.TaskService/GetTask")
  // and code name (service::RequestCounts).
  std::map<std::string, std::map<std::string, int64_t>> grpc_requests;
  // Requests refused (no token, a missing role, an id the caller may not
  // use) by port ("grpc", "http") and code, from each port's RefusalLog.
  std::map<std::string, std::map<std::string, int64_t>> refused;
};

std::string MetricsPage(const engine::EngineMetrics& m, const ProcessInfo& process);

}  // namespace taskgrid::http
