#include "common/config.h"

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include "common/build_info.h"

namespace kvfleet {

namespace {

// Options that mean the same to every binary: their plain KVFLEET_<OPTION> is no deprecated alias.
bool IsCommonOption(std::string_view long_name) {
  return long_name == "log-level" || long_name == "log-format" || long_name == "config";
}

std::string Upper(std::string_view text) {
  std::string out;
  for (char c : text) out.push_back(c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  return out;
}

}  // namespace

void AddCommonOptions(CLI::App& app, CommonOptions* options, std::string_view program) {
  options->program = std::string(program);
  app.add_option("--log-level", options->log.level, "trace, debug, info, warn, error, critical or off")
      ->capture_default_str();
  app.add_option("--log-format", options->log.format, "text, or json for log collectors")->capture_default_str();
  app.add_option("--config", options->config_file, "TOML/INI config file (key = value, [subcommand] sections)");
  app.set_version_flag("--version", VersionLine(program), "print the version, git commit and build type, and exit");
}

std::string VersionLine(std::string_view program) {
  const BuildInfo& b = GetBuildInfo();
  return std::string(program) + " " + std::string(b.version) + " (git " + std::string(b.git_sha) + ", " +
         std::string(b.build_type) + ")";
}

std::string EnvPrefixFor(std::string_view program) {
  if (program.starts_with("kvfleet-")) return "KVFLEET_" + Upper(program.substr(8)) + "_";
  return "KVFLEET_";
}

std::string EnvNameFor(std::string_view long_name, std::string_view prefix) {
  return std::string(prefix) + Upper(long_name);
}

void BindEnvironment(CLI::App& app, std::string_view prefix, std::vector<std::string>* warnings) {
  for (CLI::Option* opt : app.get_options()) {
    const auto& names = opt->get_lnames();
    if (names.empty() || names.front() == "help" || names.front() == "version") continue;
    const std::string name = EnvNameFor(names.front(), prefix);
    const std::string plain = EnvNameFor(names.front());
    opt->envname(name);
    if (name == plain || std::getenv(name.c_str()) != nullptr || std::getenv(plain.c_str()) == nullptr) continue;
    opt->envname(plain);
    if (!IsCommonOption(names.front()) && warnings != nullptr) {
      warnings->push_back(plain + " is deprecated: set " + name + " (a plain KVFLEET_ name can mean " +
                          "something else to another kvfleet binary)");
    }
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    BindEnvironment(*sub, std::string(prefix) + Upper(sub->get_name()) + "_", warnings);
  }
}

namespace {

// Finds the config file before the real parse: from --config on the command line, or
// from the environment (the binary's <PREFIX>CONFIG, then KVFLEET_CONFIG).
std::string FindConfigPath(int argc, char** argv, const std::string& prefix) {
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--config" && i + 1 < argc) return argv[i + 1];
    if (a.starts_with("--config=")) return std::string(a.substr(9));
  }
  for (const std::string& name : {prefix + "CONFIG", std::string("KVFLEET_CONFIG")}) {
    if (const char* env = std::getenv(name.c_str())) return env;
  }
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
  const std::string prefix = EnvPrefixFor(common->program);
  std::vector<std::string> deprecated;
  BindEnvironment(app, prefix, &deprecated);
  std::string config = FindConfigPath(argc, argv, prefix);
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
  for (const std::string& warning : deprecated) Logger("config")->warn("{}", warning);
  return -1;
}

}  // namespace kvfleet
