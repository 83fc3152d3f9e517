# loadstone_test(NAME SOURCES a.cc b.cc [LIBS ...] [LABELS ...])
# One Catch2 executable; each TEST_CASE becomes its own CTest test carrying LABELS.
find_package(Catch2 2 REQUIRED)
include(Catch)

add_library(loadstone_catch_main STATIC ${PROJECT_SOURCE_DIR}/tests/catch_main.cc)
target_link_libraries(loadstone_catch_main PUBLIC Catch2::Catch2)

function(loadstone_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE loadstone_catch_main loadstone_warnings ${ARG_LIBS})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/tests)
  target_compile_definitions(${name} PRIVATE
    LOADSTONE_SOURCE_DIR="${PROJECT_SOURCE_DIR}" LOADSTONE_BINARY_DIR="${PROJECT_BINARY_DIR}")
  # --warn NoTests: a test whose name CTest cannot pass back to Catch (a ";" splits it) fails
  # instead of passing with nothing run.
  catch_discover_tests(${name} TEST_PREFIX "${name}:" EXTRA_ARGS --warn NoTests
                       PROPERTIES LABELS "${ARG_LABELS}")
endfunction()
