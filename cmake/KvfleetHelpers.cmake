# Helpers shared by every CMakeLists.txt in the tree.

set(KVFLEET_WARNINGS -Wall -Wextra -Wno-unused-parameter)

# kvfleet_add_subdirs(): adds every immediate child folder that has a CMakeLists.txt,
# so a new module joins the build without editing its parent.
function(kvfleet_add_subdirs)
  file(GLOB children LIST_DIRECTORIES true RELATIVE ${CMAKE_CURRENT_SOURCE_DIR} ${CMAKE_CURRENT_SOURCE_DIR}/*)
  list(SORT children)
  foreach(child ${children})
    if(IS_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/${child} AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/${child}/CMakeLists.txt)
      add_subdirectory(${child})
    endif()
  endforeach()
endfunction()

# kvfleet_library(NAME name SOURCES ... [DEPS ...]): a static library with the project's
# warnings and the repository root on its include path.
function(kvfleet_library)
  cmake_parse_arguments(ARG "" "NAME" "SOURCES;DEPS" ${ARGN})
  add_library(${ARG_NAME} STATIC ${ARG_SOURCES})
  target_include_directories(${ARG_NAME} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
  target_compile_options(${ARG_NAME} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${KVFLEET_WARNINGS}>)
  if(ARG_DEPS)
    target_link_libraries(${ARG_NAME} PUBLIC ${ARG_DEPS})
  endif()
endfunction()

# kvfleet_test(NAME name LABELS l1 [l2] SOURCES ... [DEPS ...] [TIMEOUT s] [ASAN] [TSAN]):
# a doctest executable registered with ctest under the given labels. ASAN / TSAN put it
# in the set that tests/run.sh builds and runs again under that sanitizer (targets
# kvfleet_asan_tests / kvfleet_tsan_tests; ctest labels asan / tsan).
function(kvfleet_test)
  cmake_parse_arguments(ARG "ASAN;TSAN" "NAME;TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  if(ARG_ASAN)
    list(APPEND ARG_LABELS asan)
    set_property(GLOBAL APPEND PROPERTY KVFLEET_ASAN_TESTS ${ARG_NAME})
  endif()
  if(ARG_TSAN)
    list(APPEND ARG_LABELS tsan)
    set_property(GLOBAL APPEND PROPERTY KVFLEET_TSAN_TESTS ${ARG_NAME})
  endif()
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  target_link_libraries(${ARG_NAME} PRIVATE kvfleet_doctest_main ${ARG_DEPS})
  target_include_directories(${ARG_NAME} PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
  target_compile_options(${ARG_NAME} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${KVFLEET_WARNINGS}>)
  if(KVFLEET_TEST_CXX_FLAGS)
    target_compile_options(${ARG_NAME} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${KVFLEET_TEST_CXX_FLAGS}>)
  endif()
  add_test(NAME ${ARG_NAME} COMMAND ${ARG_NAME})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  set_tests_properties(${ARG_NAME} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT})
endfunction()

# kvfleet_bench(NAME name SOURCES ... [DEPS ...]): a benchmark program. Benchmarks print
# their figures; they are not tests and ctest does not run them, so they are left out of the
# default build: target kvfleet_benches builds them all (tests/bench/run.sh, deploy/bundle.sh).
function(kvfleet_bench)
  cmake_parse_arguments(ARG "" "NAME" "SOURCES;DEPS" ${ARGN})
  add_executable(${ARG_NAME} EXCLUDE_FROM_ALL ${ARG_SOURCES})
  set_property(GLOBAL APPEND PROPERTY KVFLEET_BENCHES ${ARG_NAME})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS})
  target_include_directories(${ARG_NAME} PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
  target_compile_options(${ARG_NAME} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${KVFLEET_WARNINGS}>)
  set_target_properties(${ARG_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bench)
endfunction()

# kvfleet_fuzzer(NAME name SOURCES ... [DEPS ...]): a libFuzzer target (LLVMFuzzerTestOneInput).
# Built only with -DKVFLEET_FUZZ=ON and clang (tests/fuzz/run.sh does that in build-fuzz);
# run for a bounded time by tests/run.sh. Corpus seeds: tests/fuzz/corpus/<name>/.
function(kvfleet_fuzzer)
  cmake_parse_arguments(ARG "" "NAME" "SOURCES;DEPS" ${ARGN})
  if(NOT KVFLEET_FUZZ)
    return()
  endif()
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS})
  target_include_directories(${ARG_NAME} PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
  target_compile_options(${ARG_NAME} PRIVATE -fsanitize=fuzzer)
  target_link_options(${ARG_NAME} PRIVATE -fsanitize=fuzzer)
  set_target_properties(${ARG_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/fuzzers)
  set_property(GLOBAL APPEND PROPERTY KVFLEET_FUZZERS ${ARG_NAME})
endfunction()
