// Configuration conventions shared by every kvfleet binary.
//
// Each option is set, in order of precedence, by:
//   1. the command line:  --block-size 16
//   2. the environment:   KVFLEET_BLOCK_SIZE=16
//      Rule: "KVFLEET_" + the long option name, upper-cased, with '-' turned into '_'.
//   3. a config file:     --config worker.toml (or KVFLEET_CONFIG), TOML/INI lines
//      "block-size = 16"; a subcommand's options go under "[subcommand]".
//   4. the built-in default, which --help prints beside each option.
//
// Thread safety: start-up only.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "common/log.h"
#include "common/status.h"

namespace kvfleet {

// Options every binary has: --log-level, --log-format, --config.
struct CommonOptions {
  LogOptions log;
  std::string config_file;  // empty: none
};

// Adds the common options to `app`.
void AddCommonOptions(CLI::App& app, CommonOptions* options);

// The environment variable for a long option name: "block-size" -> "KVFLEET_BLOCK_SIZE".
std::string EnvNameFor(std::string_view long_name);

// Gives every option of `app` and its subcommands its environment variable (the rule
// above). Call once all options are added.
void BindEnvironment(CLI::App& app);

// Parses argv with the precedence above. Returns the process exit code when the program
// should stop now (after --help, or on an error, already printed), or -1 to go on.
int ParseCommandLine(CLI::App& app, CommonOptions* common, int argc, char** argv);

}  // namespace kvfleet
