// Configuration conventions shared by every kvfleet binary.
//
// Each option is set, in order of precedence, by:
//   1. the command line:  --block-size 16
//   2. the environment:   KVFLEET_WORKER_BLOCK_SIZE=16
//      Rule: the binary's prefix + the long option name, upper-cased, with '-' turned into
//      '_'. The prefixes: KVFLEET_ROUTER_ (kvfleet-router), KVFLEET_WORKER_ (kvfleet-worker),
//      and KVFLEET_<SUBCOMMAND>_ for the options of a `kvfleet` subcommand (KVFLEET_UP_WORKERS).
//      One name per binary, because the same option means different things to different
//      binaries: --http-port is 8000 to the router and 9400 to a worker, --workers a count to
//      `kvfleet up` and a list of endpoints to the router.
//      The common options (--log-level, --log-format, --config) mean the same to every
//      binary and also read the plain KVFLEET_LOG_LEVEL, KVFLEET_LOG_FORMAT, KVFLEET_CONFIG.
//      Deprecated: the plain KVFLEET_<OPTION> of any other option is still read when the
//      prefixed one is unset, with a warning at start-up naming the new variable.
//   3. a config file:     --config worker.toml (or KVFLEET_WORKER_CONFIG, KVFLEET_CONFIG),
//      TOML/INI lines "block-size = 16"; a subcommand's options go under "[subcommand]".
//   4. the built-in default, which --help prints beside each option.
// --version prints the binary's name, kvfleet's version, git commit and build type.
//
// Thread safety: start-up only.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/log.h"
#include "common/status.h"

namespace kvfleet {

// Options every binary has: --log-level, --log-format, --config, --version.
struct CommonOptions {
  LogOptions log;
  std::string config_file;  // empty: none
  std::string program;      // "kvfleet-router", "kvfleet-worker", "kvfleet"; set by AddCommonOptions
};

// Adds the common options to `app`, for the binary `program` (its --version line and its
// environment prefix, EnvPrefixFor).
void AddCommonOptions(CLI::App& app, CommonOptions* options, std::string_view program = "kvfleet");

// "kvfleet-router 0.1.0 (git 0123456789ab, Release)": what --version prints.
std::string VersionLine(std::string_view program);

// The environment prefix of a binary: "kvfleet-router" -> "KVFLEET_ROUTER_", "kvfleet" ->
// "KVFLEET_" (whose subcommands' options take KVFLEET_<SUBCOMMAND>_).
std::string EnvPrefixFor(std::string_view program);

// The environment variable for a long option name: ("block-size", "KVFLEET_WORKER_") ->
// "KVFLEET_WORKER_BLOCK_SIZE".
std::string EnvNameFor(std::string_view long_name, std::string_view prefix = "KVFLEET_");

// Gives every option of `app` and its subcommands its environment variable (the rule
// above, with `prefix` for the options of `app` itself). Where only the deprecated plain
// variable is set, binds that one and adds a warning for people to `warnings`. Call once
// all options are added.
void BindEnvironment(CLI::App& app, std::string_view prefix = "KVFLEET_", std::vector<std::string>* warnings = nullptr);

// Parses argv with the precedence above; logs the environment's deprecation warnings once
// logging is set up. Returns the process exit code when the program should stop now (after
// --help or --version, or on an error, already printed), or -1 to go on.
int ParseCommandLine(CLI::App& app, CommonOptions* common, int argc, char** argv);

}  // namespace kvfleet
