# taskgrid_test(<name> SOURCES <files>... LIBS <targets>... [LABELS <labels>...]
#               [TIMEOUT <seconds>] [TSAN])
# One GoogleTest executable, registered test by test with ctest.
#
# TSAN: the test exercises threads (an Engine, the group-commit writer, the
# SQLite store's checkpoint thread, a worker pool, a server), so it also
# runs under ThreadSanitizer. A tree built with SANITIZE=thread defines
# only these: single-threaded logic gains nothing from TSan, and the ASan +
# UBSan tree runs every test anyway.
function(taskgrid_test name)
  cmake_parse_arguments(ARG "TSAN" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  if(SANITIZE MATCHES "thread" AND NOT ARG_TSAN)
    return()
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 120)
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gmock GTest::gtest_main)
  gtest_discover_tests(${name}
    DISCOVERY_TIMEOUT 60
    PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "${ARG_LABELS}")
endfunction()
