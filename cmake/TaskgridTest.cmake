# taskgrid_test(<name> SOURCES <files>... LIBS <targets>... [LABELS <labels>...]
#               [TIMEOUT <seconds>] [TSAN] [POSTGRES <gtest filter>])
# A GoogleTest file (or a few), registered test by test with ctest.
#
# The test files of one library go into one executable, named after the
# first label and the first of LIBS: LABELS unit with LIBS taskgrid_core
# lands in tests/unit/unit_core_tests. Its files are compiled together, up
# to 8 to a translation unit (a unity build): under the sanitizers most of
# a test file's compile time goes to the code of the headers it shares with
# the others (GoogleTest, the protos, the fixtures), which a unity build
# generates once per 8 files instead of once per file; one link replaces
# one per file as well. So names at file scope, also in an anonymous
# namespace, must not repeat another file's of the same executable: a
# clash is a compile error ("redefinition of ..."), fixed by giving the new
# file a namespace of its own (e.g. taskgrid::core::foo_test). ctest still
# runs every test case as a process of its own; <name> stays a build
# target (it builds the executable) and the executable's ctest TIMEOUT is
# the largest of its files'. TASKGRID_UNITY_TESTS=OFF compiles each file on
# its own.
#
# TSAN: the test exercises threads (an Engine, the group-commit writer, the
# SQLite store's checkpoint thread, a worker pool, a server), so it also
# runs under ThreadSanitizer. A tree built with SANITIZE=thread defines
# only these: single-threaded logic gains nothing from TSan, and the ASan +
# UBSan tree runs every test anyway.
#
# POSTGRES: the executable's test cases that match the filter (e.g.
# "*Postgres*") need the tests' PostgreSQL server: ctest starts it once
# per run for them (the fixture "postgres", tests/testing/CMakeLists.txt)
# and tells them where it is ($TASKGRID_TEST_POSTGRES, a file holding its
# URL; tests/testing/postgres.h).
option(TASKGRID_UNITY_TESTS "Compile the test files of one test executable together" ON)

function(taskgrid_test name)
  cmake_parse_arguments(ARG "TSAN" "TIMEOUT;POSTGRES" "SOURCES;LIBS;LABELS" ${ARGN})
  if(SANITIZE MATCHES "thread" AND NOT ARG_TSAN)
    return()
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 120)
  endif()
  list(GET ARG_LIBS 0 lib)
  string(REGEX REPLACE "^taskgrid_" "" lib "${lib}")
  string(REGEX REPLACE "[^A-Za-z0-9_]" "_" lib "${lib}")
  set(label tests)
  if(ARG_LABELS)
    list(GET ARG_LABELS 0 label)
  endif()
  set(exe ${label}_${lib}_tests)
  if(NOT TARGET ${exe})
    add_executable(${exe})
    target_link_libraries(${exe} PRIVATE GTest::gmock GTest::gtest_main)
    set_target_properties(${exe} PROPERTIES
      UNITY_BUILD ${TASKGRID_UNITY_TESTS} UNITY_BUILD_MODE BATCH UNITY_BUILD_BATCH_SIZE 8
      TASKGRID_TIMEOUT 0 TASKGRID_LABELS "" TASKGRID_POSTGRES "")
    # Registered once every file of this directory has joined (a deferred
    # call evaluates its arguments when it runs, hence EVAL).
    cmake_language(EVAL CODE "cmake_language(DEFER CALL _taskgrid_test_discover [[${exe}]])")
  endif()
  target_sources(${exe} PRIVATE ${ARG_SOURCES})
  target_link_libraries(${exe} PRIVATE ${ARG_LIBS})
  get_target_property(timeout ${exe} TASKGRID_TIMEOUT)
  if(ARG_TIMEOUT GREATER timeout)
    set_target_properties(${exe} PROPERTIES TASKGRID_TIMEOUT ${ARG_TIMEOUT})
  endif()
  set_property(TARGET ${exe} APPEND PROPERTY TASKGRID_LABELS ${ARG_LABELS})
  if(ARG_POSTGRES)
    set_target_properties(${exe} PROPERTIES TASKGRID_POSTGRES "${ARG_POSTGRES}")
  endif()
  add_custom_target(${name})
  add_dependencies(${name} ${exe})
endfunction()

function(_taskgrid_test_discover exe)
  get_target_property(timeout ${exe} TASKGRID_TIMEOUT)
  get_target_property(labels ${exe} TASKGRID_LABELS)
  get_target_property(postgres ${exe} TASKGRID_POSTGRES)
  list(REMOVE_DUPLICATES labels)
  if(NOT postgres)
    gtest_discover_tests(${exe}
      DISCOVERY_TIMEOUT 60
      PROPERTIES TIMEOUT ${timeout} LABELS "${labels}")
    return()
  endif()
  gtest_discover_tests(${exe}
    DISCOVERY_TIMEOUT 60
    TEST_FILTER "-${postgres}"
    PROPERTIES TIMEOUT ${timeout} LABELS "${labels}")
  gtest_discover_tests(${exe}
    DISCOVERY_TIMEOUT 60
    TEST_FILTER "${postgres}"
    PROPERTIES TIMEOUT ${timeout} LABELS "${labels}" FIXTURES_REQUIRED postgres
      ENVIRONMENT "TASKGRID_TEST_POSTGRES=${TASKGRID_POSTGRES_DIR}/url")
endfunction()
