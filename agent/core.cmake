# The gRPC-free half of the agent, included by the top-level CMakeLists.txt
# in every build (so the tests of its threaded parts also run under
# ThreadSanitizer):
#   taskgrid_agent_exec: runs the steps of an Assignment as processes,
#     builtins and HTTP requests (libcurl) and makes its TaskResult
#     (agent/executor.h);
#   taskgrid_agent_core: what the agent decides (agent/core.h): slots and
#     chains, the lease, the drain, the outbox, the live output watched,
#     with time from a Clock.
# agent/CMakeLists.txt adds the gRPC transport and the binary.
add_library(taskgrid_agent_exec STATIC
  ${CMAKE_CURRENT_LIST_DIR}/builtins.cc
  ${CMAKE_CURRENT_LIST_DIR}/executor.cc
  ${CMAKE_CURRENT_LIST_DIR}/http_step.cc
  ${CMAKE_CURRENT_LIST_DIR}/live_output.cc
  ${CMAKE_CURRENT_LIST_DIR}/process.cc)
add_library(taskgrid::agent_exec ALIAS taskgrid_agent_exec)
# The process every exec step runs under (agent/step_supervisor.h): plain
# C++ and the C library, beside the agent in <build>/bin (where the agent
# looks for it first) and installed with it. The executor also knows this
# build's copy, which is what tests that run steps in-process use.
add_executable(taskgrid-step-supervisor ${CMAKE_CURRENT_LIST_DIR}/step_supervisor_main.cc)
target_include_directories(taskgrid-step-supervisor PRIVATE ${PROJECT_SOURCE_DIR})
set_target_properties(taskgrid-step-supervisor PROPERTIES
  RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
install(TARGETS taskgrid-step-supervisor RUNTIME DESTINATION bin)
add_dependencies(taskgrid_agent_exec taskgrid-step-supervisor)
target_compile_definitions(taskgrid_agent_exec PRIVATE
  TASKGRID_BUILD_BIN_DIR="${CMAKE_BINARY_DIR}/bin")
target_include_directories(taskgrid_agent_exec PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(taskgrid_agent_exec
  PUBLIC taskgrid_proto taskgrid_common absl::time absl::strings absl::status
  PRIVATE spdlog::spdlog CURL::libcurl Threads::Threads)

add_library(taskgrid_agent_core STATIC
  ${CMAKE_CURRENT_LIST_DIR}/core.cc
  ${CMAKE_CURRENT_LIST_DIR}/drain.cc
  ${CMAKE_CURRENT_LIST_DIR}/lease.cc
  ${CMAKE_CURRENT_LIST_DIR}/outbox.cc
  ${CMAKE_CURRENT_LIST_DIR}/output_watches.cc
  ${CMAKE_CURRENT_LIST_DIR}/slots.cc)
add_library(taskgrid::agent_core ALIAS taskgrid_agent_core)
target_link_libraries(taskgrid_agent_core
  PUBLIC taskgrid_agent_exec taskgrid_common
  PRIVATE spdlog::spdlog absl::strings Threads::Threads)
