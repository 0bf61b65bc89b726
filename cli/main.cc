// kvfleet: the operator's command. `kvfleet --help` lists the subcommands.
#include <iostream>
#include <map>

#include "cli/commands.h"
#include "common/config.h"

int main(int argc, char** argv) {
  CLI::App app{"kvfleet: a cache-aware LLM serving fleet"};
  app.require_subcommand(1);
  kvfleet::CommonOptions common;
  kvfleet::AddCommonOptions(app, &common);

  std::map<std::string, kvfleet::cli::Action> actions;
  actions["hash"] = kvfleet::cli::AddHashCommand(app);
  actions["events"] = kvfleet::cli::AddEventsCommand(app);
  actions["up"] = kvfleet::cli::AddUpCommand(app);
  actions["keygen"] = kvfleet::cli::AddKeygenCommand(app);
  actions["make-model"] = kvfleet::cli::AddMakeModelCommand(app);
  actions["tokenize"] = kvfleet::cli::AddTokenizeCommand(app);
  actions["detokenize"] = kvfleet::cli::AddDetokenizeCommand(app);
  actions["bench"] = kvfleet::cli::AddBenchCommand(app);
  actions["simulate"] = kvfleet::cli::AddSimulateCommand(app);

  int rc = kvfleet::ParseCommandLine(app, &common, argc, argv);
  if (rc >= 0) return rc;
  for (CLI::App* sub : app.get_subcommands()) {
    auto it = actions.find(sub->get_name());
    if (it != actions.end()) return it->second();
  }
  std::cerr << app.help();
  return 2;
}
