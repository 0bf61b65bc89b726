// Files the CPU benches read: the asset cache (tests/assets.sh writes the npm tokenizers under
// it) and whole files.
#pragma once

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace kvfleet::bench {

// ${KVFLEET_CACHE:-$HOME/.cache/kvfleet}, as tests/assets.sh fills it.
inline std::string CacheRoot() {
  if (const char* c = std::getenv("KVFLEET_CACHE"); c && *c) return c;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "/tmp") + "/.cache/kvfleet";
}

// The file's bytes; empty when it cannot be read.
inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace kvfleet::bench
