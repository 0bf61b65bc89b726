# Finds every dependency, each with a message naming the Debian package that provides it.

macro(kvfleet_require found pkg what)
  if(NOT ${found})
    message(FATAL_ERROR "kvfleet needs ${what}: install the Debian package '${pkg}' (apt-get install ${pkg}), or run tests/run.sh, which installs everything")
  endif()
endmacro()

find_package(Threads REQUIRED)
find_package(PkgConfig)
kvfleet_require(PkgConfig_FOUND pkg-config "pkg-config")

find_package(cppzmq QUIET)
kvfleet_require(cppzmq_FOUND "libzmq3-dev cppzmq-dev" "ZeroMQ and its C++ binding cppzmq")

find_package(CapnProto QUIET)
kvfleet_require(CapnProto_FOUND "capnproto libcapnp-dev" "Cap'n Proto (the capnp compiler and libraries)")

find_package(Boost 1.81 QUIET)
kvfleet_require(Boost_FOUND "libboost1.81-dev" "Boost >= 1.81 (Asio, Beast)")

find_package(prometheus-cpp QUIET)
kvfleet_require(prometheus-cpp_FOUND "prometheus-cpp-dev" "prometheus-cpp")

find_package(doctest QUIET)
kvfleet_require(doctest_FOUND "doctest-dev" "doctest")

find_package(nlohmann_json 3.10 QUIET)
kvfleet_require(nlohmann_json_FOUND "nlohmann-json3-dev" "nlohmann-json")

# The router parses request bodies with it (router/http/json_body.h).
find_package(simdjson QUIET)
kvfleet_require(simdjson_FOUND "libsimdjson-dev" "simdjson")

find_package(CLI11 QUIET)
kvfleet_require(CLI11_FOUND "libcli11-dev" "CLI11")

find_package(spdlog QUIET)
kvfleet_require(spdlog_FOUND "libspdlog-dev" "spdlog")

pkg_check_modules(XXHASH QUIET IMPORTED_TARGET libxxhash)
kvfleet_require(XXHASH_FOUND "libxxhash-dev" "xxHash")

pkg_check_modules(PCRE2 QUIET IMPORTED_TARGET libpcre2-8)
kvfleet_require(PCRE2_FOUND "libpcre2-dev" "PCRE2")

# Unicode normalization (NFC for Qwen's tokenizer) in tokenizer/.
pkg_check_modules(UTF8PROC QUIET IMPORTED_TARGET libutf8proc)
kvfleet_require(UTF8PROC_FOUND "libutf8proc-dev" "utf8proc (Unicode normalization for the tokenizer)")

if(KVFLEET_CUDA)
  # CMake 3.25 has no CUDA::nccl target; NCCL ships with the toolkit on our machines.
  find_library(KVFLEET_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/lib/x86_64-linux-gnu)
  find_path(KVFLEET_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/include)
  if(KVFLEET_NCCL_LIBRARY AND KVFLEET_NCCL_INCLUDE)
    add_library(kvfleet_nccl INTERFACE)
    target_link_libraries(kvfleet_nccl INTERFACE ${KVFLEET_NCCL_LIBRARY})
    target_include_directories(kvfleet_nccl INTERFACE ${KVFLEET_NCCL_INCLUDE})
    set(KVFLEET_HAVE_NCCL ON)
  else()
    message(STATUS "kvfleet: NCCL not found; tensor parallelism will be unavailable")
    set(KVFLEET_HAVE_NCCL OFF)
  endif()
endif()
