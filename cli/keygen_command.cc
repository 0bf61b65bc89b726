// kvfleet keygen: writes a ZMQ CURVE key pair file (and the public key beside it) for the
// event and replay sockets between workers and routers (common/curve_keys.h has the format).
#include <fstream>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "common/curve_keys.h"

namespace kvfleet::cli {

Action AddKeygenCommand(CLI::App& parent) {
  auto path = std::make_shared<std::string>();
  CLI::App* cmd = parent.add_subcommand(
      "keygen", "write a CURVE key pair to PATH (mode 0600) and its public key to PATH.pub");
  cmd->add_option("path", *path, "key pair file to write")->required();
  return [path]() {
    auto keys = GenerateCurveKeyPair();
    if (!keys.ok()) {
      std::cerr << "error: " << keys.status().ToString() << "\n";
      return 1;
    }
    Status st = WriteCurveKeyPair(*path, *keys);
    if (!st.ok()) {
      std::cerr << "error: " << st.ToString() << "\n";
      return 1;
    }
    std::ofstream(*path + ".pub") << keys->public_key << "\n";
    std::cout << keys->public_key << "\n";
    return 0;
  };
}

}  // namespace kvfleet::cli
