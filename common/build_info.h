// What this binary is: kvfleet's version (CMake's project version), the git commit it was
// configured from and its build type. /version and the kvfleet_build_info metric report it.
//
// Thread safety: immutable.
#pragma once

#include <string_view>

namespace kvfleet {

struct BuildInfo {
  std::string_view version;     // "0.1.0"
  std::string_view git_sha;     // 12 hex digits, "+dirty" when the tree had changes; "unknown" outside git
  std::string_view build_type;  // "Release", "RelWithDebInfo", ...
};

const BuildInfo& GetBuildInfo();

}  // namespace kvfleet
