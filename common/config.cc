#include "common/config.h"

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <iostream>

namespace kvfleet {

void AddCommonOptions(CLI::App& app, CommonOptions* options) {
  app.add_option("--log-level", options->log.level, "trace, debug, info, warn, error, critical or off")
      ->capture_default_str();
  app.add_option("--log-format", options->log.format, "text, or json for log collectors")->capture_default_str();
  app.add_option("--config", options->config_file, "TOML/INI config file (key = value, [subcommand] sections)");
}

std::string EnvNameFor(std::string_view long_name) {
  std::string env = "KVFLEET_";
  for (char c : long_name) env.push_back(c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  return env;
}

void BindEnvironment(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    const auto& names = opt->get_lnames();
    if (names.empty() || names.front() == "help") continue;
    opt->envname(EnvNameFor(names.front()));
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) BindEnvironment(*sub);
}

namespace {

// Finds the config file before the real parse: from --config on the command line, or
// from KVFLEET_CONFIG.
std::string FindConfigPath(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--config" && i + 1 < argc) return argv[i + 1];
    if (a.starts_with("--config=")) return std::string(a.substr(9));
  }
  if (const char* env = std::getenv("KVFLEET_CONFIG")) return env;
  return "";
}

// Applies the config file's values as the options' defaults, so the command line and
// the environment still override them.
Status ApplyConfigDefaults(CLI::App& app, const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("config file '" + path + "' cannot be read");
  std::vector<CLI::ConfigItem> items;
  try {
    items = CLI::ConfigTOML().from_config(in);
  } catch (const std::exception& e) {
    return InvalidArgument("config file '" + path + "': " + e.what());
  }
  for (const auto& item : items) {
    if (item.name == "++" || item.name == "--") continue;  // section markers
    CLI::App* target = &app;
    bool found = true;
    for (const auto& parent : item.parents) {
      CLI::App* sub = nullptr;
      try {
        sub = target->get_subcommand(parent);
      } catch (const CLI::OptionNotFound&) {
      }
      if (!sub) {
        found = false;
        break;
      }
      target = sub;
    }
    CLI::Option* opt = found ? target->get_option_no_throw("--" + item.name) : nullptr;
    if (!opt) return InvalidArgument("config file '" + path + "': unknown option '" + item.fullname() + "'");
    std::string value;
    for (size_t i = 0; i < item.inputs.size(); ++i) value += (i ? " " : "") + item.inputs[i];
    try {
      opt->default_val(value);
    } catch (const std::exception& e) {
      return InvalidArgument("config file '" + path + "': option '" + item.fullname() + "': " + e.what());
    }
  }
  return Status::Ok();
}

}  // namespace

int ParseCommandLine(CLI::App& app, CommonOptions* common, int argc, char** argv) {
  BindEnvironment(app);
  std::string config = FindConfigPath(argc, argv);
  if (!config.empty()) {
    Status st = ApplyConfigDefaults(app, config);
    if (!st.ok()) {
      std::cerr << "error: " << st.message() << "\n";
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  Status st = InitLogging(common->log);
  if (!st.ok()) {
    std::cerr << "error: " << st.message() << "\n";
    return 2;
  }
  return -1;
}

}  // namespace kvfleet
