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
// kvfleet events --events EP | --replay EP --snapshot: a worker's KV events as JSON lines
Action AddEventsCommand(CLI::App& parent);
// kvfleet keygen PATH: a CURVE key pair file for the event sockets
Action AddKeygenCommand(CLI::App& parent);

// kvfleet up --backend mock --workers N: a router and N workers on loopback.
Action AddUpCommand(CLI::App& parent);

// kvfleet make-model --shape S --tokenizer DIR --out DIR [--seed N] [--dtype bf16|fp32]
Action AddMakeModelCommand(CLI::App& parent);
// kvfleet tokenize --model-dir DIR [--chat] / kvfleet detokenize --model-dir DIR (stdin lines)
Action AddTokenizeCommand(CLI::App& parent);
Action AddDetokenizeCommand(CLI::App& parent);
// kvfleet bench --router URL --trace FILE.jsonl [...] (cli/bench/)
Action AddBenchCommand(CLI::App& parent);
// kvfleet simulate --router EP --workers N [...]: simulated workers for router scale tests (cli/simulate/)
Action AddSimulateCommand(CLI::App& parent);

}  // namespace kvfleet::cli
