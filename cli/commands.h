// The `kvfleet` subcommands. Each Add*Command registers its options on `parent` and
// returns the action to run when that subcommand is chosen; the action returns the
// process exit code.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace kvfleet::cli {

using Action = std::function<int()>;

// kvfleet hash --model NAME [--lora L] [--salt S] --block-size B TOKEN...
Action AddHashCommand(CLI::App& parent);
// kvfleet bench --router URL --trace FILE.jsonl [...] (cli/bench/)
Action AddBenchCommand(CLI::App& parent);

}  // namespace kvfleet::cli
