# The agent's task executor against real processes (agent/executor.h).
taskgrid_test(executor_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/executor_test.cc
  LIBS taskgrid_agent_exec
  LABELS integration)
# The http steps (agent/http_step.h) against a tiny HTTP server of the test's own.
taskgrid_test(http_step_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/http_step_test.cc
  LIBS taskgrid_agent_exec
  LABELS integration)
