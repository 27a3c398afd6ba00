# The agent's task executor against real processes (agent/executor.h).
taskgrid_test(executor_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/executor_test.cc
  LIBS taskgrid_agent_exec
  LABELS integration)
