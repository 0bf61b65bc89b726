// A schema vectors file (schema/*_vectors.txt) as name -> frame bytes: each `vector NAME`
// line names the `frame HEX` lines after it. The event and transfer codec tests read theirs
// with it.
#pragma once

#include <doctest/doctest.h>

#include <fstream>
#include <map>
#include <string>

namespace kvfleet::testing {

// `file` is relative to the repository (KVFLEET_SOURCE_DIR), e.g. "schema/event_vectors.txt".
inline std::map<std::string, std::string> LoadFrameVectors(const std::string& file) {
  std::ifstream in(std::string(KVFLEET_SOURCE_DIR) + "/" + file);
  REQUIRE_MESSAGE(in.good(), file);
  std::map<std::string, std::string> out;
  std::string line, name;
  while (std::getline(in, line)) {
    if (line.rfind("vector ", 0) == 0) name = line.substr(7);
    if (line.rfind("frame ", 0) != 0) continue;
    std::string bytes;
    for (size_t i = 6; i + 1 < line.size(); i += 2) bytes.push_back(static_cast<char>(std::stoi(line.substr(i, 2), nullptr, 16)));
    out[name] = bytes;
  }
  return out;
}

}  // namespace kvfleet::testing
