# Build options. Each one is printed at configure time.

# ccache, when present, caches every C++ and CUDA compilation.
find_program(KVFLEET_CCACHE ccache)
if(KVFLEET_CCACHE)
  set(CMAKE_C_COMPILER_LAUNCHER ${KVFLEET_CCACHE})
  set(CMAKE_CXX_COMPILER_LAUNCHER ${KVFLEET_CCACHE})
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${KVFLEET_CCACHE})
endif()

# KVFLEET_CUDA: ON when nvcc is found. With it OFF everything but the cuda backend builds.
include(CheckLanguage)
if(NOT DEFINED KVFLEET_CUDA)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(_kvfleet_cuda_default ON)
  else()
    set(_kvfleet_cuda_default OFF)
  endif()
  option(KVFLEET_CUDA "Build the CUDA backend and kernels" ${_kvfleet_cuda_default})
endif()
if(KVFLEET_CUDA)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  # Hopper only (sm_90a: wgmma, setmaxnreg). The -gencode form is what nvcc 13.0 accepts for 90a.
  set(CMAKE_CUDA_ARCHITECTURES OFF)
  set(KVFLEET_CUDA_GENCODE "-gencode=arch=compute_90a,code=sm_90a" CACHE STRING "nvcc code generation flags")
  enable_language(CUDA)
  # CMake 3.25 cannot map CUDA20 onto nvcc 13 ("does not know the flags"); the kernels are C++17.
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  string(APPEND CMAKE_CUDA_FLAGS " ${KVFLEET_CUDA_GENCODE} --expt-relaxed-constexpr -Xcompiler=-Wall")
  find_package(CUDAToolkit REQUIRED)
endif()

# KVFLEET_SANITIZE: "" (none), "address" (ASan + UBSan) or "thread" (TSan).
set(KVFLEET_SANITIZE "" CACHE STRING "Sanitizer build: '', 'address' (ASan+UBSan) or 'thread' (TSan)")
set_property(CACHE KVFLEET_SANITIZE PROPERTY STRINGS "" address thread)
if(KVFLEET_SANITIZE STREQUAL "address")
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
elseif(KVFLEET_SANITIZE STREQUAL "thread")
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
elseif(NOT KVFLEET_SANITIZE STREQUAL "")
  message(FATAL_ERROR "KVFLEET_SANITIZE must be '', 'address' or 'thread', not '${KVFLEET_SANITIZE}'")
endif()

# libFuzzer targets need clang; they are built only when the C++ compiler is clang.
option(KVFLEET_FUZZ "Build libFuzzer targets (needs clang)" OFF)
if(KVFLEET_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "KVFLEET_FUZZ needs clang: configure with CC=clang CXX=clang++")
  endif()
  # Everything is built with the fuzzer's coverage and ASan+UBSan, so bugs in libraries show.
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
endif()

# KVFLEET_TEST_CXX_FLAGS: extra flags for the test executables' own sources (not the libraries
# they test, nor the test helper libraries). tests/run.sh passes -O0 in its sanitizer builds:
# the test sources are most of what those builds compile, their code generation is most of
# that time, and -O0 halves it while the code under test keeps the build's optimisation.
set(KVFLEET_TEST_CXX_FLAGS "" CACHE STRING "Extra compile flags for test executables' sources")
