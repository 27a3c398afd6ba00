// RETURN_IF_ERROR and ASSIGN_OR_RETURN for absl::Status / absl::StatusOr,
// which Abseil 20220623 does not ship.
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TASKGRID_CONCAT_INNER_(a, b) a##b
#define TASKGRID_CONCAT_(a, b) TASKGRID_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)          \
  do {                                 \
    ::absl::Status _status = (expr);   \
    if (!_status.ok()) return _status; \
  } while (0)

#define ASSIGN_OR_RETURN(lhs, expr) \
  TASKGRID_ASSIGN_OR_RETURN_IMPL_(TASKGRID_CONCAT_(_statusor_, __LINE__), lhs, expr)

#define TASKGRID_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                    \
  if (!statusor.ok()) return std::move(statusor).status();   \
  lhs = std::move(statusor).value()
