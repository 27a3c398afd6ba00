# taskgrid_agent_exec: runs the steps of an Assignment as processes and
# builtins and makes its TaskResult (agent/executor.h). gRPC-free, so its
# tests need no server. Included by agent/CMakeLists.txt.
add_library(taskgrid_agent_exec STATIC
  ${CMAKE_CURRENT_LIST_DIR}/builtins.cc
  ${CMAKE_CURRENT_LIST_DIR}/executor.cc
  ${CMAKE_CURRENT_LIST_DIR}/process.cc)
add_library(taskgrid::agent_exec ALIAS taskgrid_agent_exec)
target_include_directories(taskgrid_agent_exec PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(taskgrid_agent_exec
  PUBLIC taskgrid_proto taskgrid_common absl::time absl::strings absl::status
  PRIVATE spdlog::spdlog Threads::Threads)
