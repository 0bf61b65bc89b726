#include "common/config.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <doctest/doctest.h>

using namespace kvfleet;

namespace {
struct Args {
  std::vector<std::string> storage;
  std::vector<char*> argv;
  explicit Args(std::initializer_list<std::string> a) : storage(a) {
    for (auto& s : storage) argv.push_back(s.data());
  }
  int argc() { return static_cast<int>(argv.size()); }
};

struct TestOptions {
  CommonOptions common;
  int block_size = 32;
  std::string model = "default-model";
};

void Setup(CLI::App& app, TestOptions* o) {
  AddCommonOptions(app, &o->common);
  app.add_option("--block-size", o->block_size, "tokens per block")->capture_default_str();
  app.add_option("--model", o->model, "model")->capture_default_str();
}

std::string WriteConfig(const std::string& text) {
  auto path = std::filesystem::temp_directory_path() / ("kvfleet_config_test_" + std::to_string(::getpid()) + ".toml");
  std::ofstream(path) << text;
  return path.string();
}
}  // namespace

TEST_CASE("the environment variable of an option follows one rule, with the binary's prefix") {
  CHECK(EnvNameFor("block-size") == "KVFLEET_BLOCK_SIZE");
  CHECK(EnvNameFor("log-level") == "KVFLEET_LOG_LEVEL");
  CHECK(EnvPrefixFor("kvfleet-router") == "KVFLEET_ROUTER_");
  CHECK(EnvPrefixFor("kvfleet-worker") == "KVFLEET_WORKER_");
  CHECK(EnvPrefixFor("kvfleet") == "KVFLEET_");
  CHECK(EnvNameFor("http-port", EnvPrefixFor("kvfleet-worker")) == "KVFLEET_WORKER_HTTP_PORT");
}

namespace {
// Parses `args` for a binary named `program` with `env` set; the warnings it logged.
struct EnvParse {
  TestOptions o;
  int rc = 0;
  std::vector<std::string> warnings;
  EnvParse(const std::string& program, const std::vector<std::pair<std::string, std::string>>& env,
           std::initializer_list<std::string> args = {"prog"}) {
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    CLI::App app;
    AddCommonOptions(app, &o.common, program);
    app.add_option("--block-size", o.block_size, "tokens per block");
    app.add_option("--model", o.model, "model");
    BindEnvironment(app, EnvPrefixFor(program), &warnings);
    Args a(args);
    try {
      app.parse(a.argc(), a.argv.data());
    } catch (const CLI::ParseError& e) {
      rc = app.exit(e);
    }
    for (const auto& [k, v] : env) ::unsetenv(k.c_str());
  }
};
}  // namespace

TEST_CASE("each binary reads its own prefixed variables, and a plain one only with a deprecation warning") {
  // Regression: KVFLEET_HTTP_PORT meant 8000 to the router and 9400 to a worker, and
  // KVFLEET_WORKERS a count to `kvfleet up` but a list of endpoints to the router.
  SUBCASE("the binary's own name") {
    EnvParse p("kvfleet-worker", {{"KVFLEET_WORKER_BLOCK_SIZE", "16"}, {"KVFLEET_ROUTER_BLOCK_SIZE", "64"}});
    CHECK(p.o.block_size == 16);
    CHECK(p.warnings.empty());
  }
  SUBCASE("the plain name still works, with a warning naming the new one") {
    EnvParse p("kvfleet-worker", {{"KVFLEET_BLOCK_SIZE", "8"}});
    CHECK(p.o.block_size == 8);
    REQUIRE(p.warnings.size() == 1);
    CHECK(p.warnings[0].find("KVFLEET_BLOCK_SIZE is deprecated: set KVFLEET_WORKER_BLOCK_SIZE") == 0);
  }
  SUBCASE("the prefixed name wins over the plain one, without a warning") {
    EnvParse p("kvfleet-router", {{"KVFLEET_ROUTER_MODEL", "llama"}, {"KVFLEET_MODEL", "qwen"}});
    CHECK(p.o.model == "llama");
    CHECK(p.warnings.empty());
  }
  SUBCASE("the common options keep their plain names, meaning the same to every binary") {
    EnvParse p("kvfleet-router", {{"KVFLEET_LOG_FORMAT", "json"}});
    CHECK(p.o.common.log.format == "json");
    CHECK(p.warnings.empty());
  }
  SUBCASE("the command line beats both") {
    EnvParse p("kvfleet-worker", {{"KVFLEET_WORKER_BLOCK_SIZE", "16"}}, {"prog", "--block-size", "64"});
    CHECK(p.o.block_size == 64);
  }
}

TEST_CASE("a kvfleet subcommand's options take KVFLEET_<SUBCOMMAND>_") {
  CLI::App app;
  CommonOptions common;
  AddCommonOptions(app, &common, "kvfleet");
  CLI::App* up = app.add_subcommand("up", "a fleet");
  int workers = 2;
  up->add_option("--workers", workers, "workers");
  ::setenv("KVFLEET_UP_WORKERS", "4", 1);
  std::vector<std::string> warnings;
  BindEnvironment(app, EnvPrefixFor("kvfleet"), &warnings);
  Args a{"kvfleet", "up"};
  app.parse(a.argc(), a.argv.data());
  ::unsetenv("KVFLEET_UP_WORKERS");
  CHECK(workers == 4);
  CHECK(warnings.empty());
}

TEST_CASE("--version prints the binary, its version and commit, and exits 0") {
  CHECK(VersionLine("kvfleet-router").starts_with("kvfleet-router "));
  CHECK(VersionLine("kvfleet-router").find("(git ") != std::string::npos);
  for (const char* program : {"kvfleet-router", "kvfleet"}) {
    TestOptions o;
    CLI::App app;
    AddCommonOptions(app, &o.common, program);
    if (std::string(program) == "kvfleet") app.require_subcommand(1);  // as the CLI does
    std::ostringstream out;
    std::streambuf* old = std::cout.rdbuf(out.rdbuf());
    Args a{program, "--version"};
    int rc = ParseCommandLine(app, &o.common, a.argc(), a.argv.data());
    std::cout.rdbuf(old);
    CHECK(rc == 0);
    CHECK(out.str() == VersionLine(program) + "\n");
  }
}

TEST_CASE("command line beats environment, which beats the config file, which beats the default") {
  std::string cfg = WriteConfig("block-size = 8\nmodel = \"from-file\"\n");
  SUBCASE("config file over default") {
    TestOptions o;
    CLI::App app;
    Setup(app, &o);
    Args a{"prog", "--config", cfg};
    CHECK(ParseCommandLine(app, &o.common, a.argc(), a.argv.data()) == -1);
    CHECK(o.block_size == 8);
    CHECK(o.model == "from-file");
  }
  SUBCASE("environment over config file") {
    ::setenv("KVFLEET_BLOCK_SIZE", "16", 1);
    TestOptions o;
    CLI::App app;
    Setup(app, &o);
    Args a{"prog", "--config", cfg};
    CHECK(ParseCommandLine(app, &o.common, a.argc(), a.argv.data()) == -1);
    ::unsetenv("KVFLEET_BLOCK_SIZE");
    CHECK(o.block_size == 16);
    CHECK(o.model == "from-file");
  }
  SUBCASE("command line over environment") {
    ::setenv("KVFLEET_BLOCK_SIZE", "16", 1);
    TestOptions o;
    CLI::App app;
    Setup(app, &o);
    Args a{"prog", "--config", cfg, "--block-size", "64"};
    CHECK(ParseCommandLine(app, &o.common, a.argc(), a.argv.data()) == -1);
    ::unsetenv("KVFLEET_BLOCK_SIZE");
    CHECK(o.block_size == 64);
  }
  std::filesystem::remove(cfg);
}

TEST_CASE("a config file naming an unknown option is an error, not ignored") {
  std::string cfg = WriteConfig("blok-size = 8\n");
  TestOptions o;
  CLI::App app;
  Setup(app, &o);
  Args a{"prog", "--config", cfg};
  CHECK(ParseCommandLine(app, &o.common, a.argc(), a.argv.data()) == 2);
  std::filesystem::remove(cfg);
}

TEST_CASE("a missing config file and a bad log level are errors") {
  {
    TestOptions o;
    CLI::App app;
    Setup(app, &o);
    Args a{"prog", "--config", "/nonexistent/kvfleet.toml"};
    CHECK(ParseCommandLine(app, &o.common, a.argc(), a.argv.data()) == 2);
  }
  {
    TestOptions o;
    CLI::App app;
    Setup(app, &o);
    Args a{"prog", "--log-level", "loud"};
    CHECK(ParseCommandLine(app, &o.common, a.argc(), a.argv.data()) == 2);
  }
}

TEST_CASE("--help lists every option with its default and exits 0") {
  TestOptions o;
  CLI::App app;
  Setup(app, &o);
  std::string help = app.help();
  CHECK(help.find("--block-size") != std::string::npos);
  CHECK(help.find("32") != std::string::npos);
  CHECK(help.find("--log-level") != std::string::npos);
  CHECK(help.find("KVFLEET_BLOCK_SIZE") == std::string::npos);  // not bound until parse
  Args a{"prog", "--help"};
  // Redirect CLI11's help printing away from the test log.
  std::streambuf* old = std::cout.rdbuf(nullptr);
  int rc = ParseCommandLine(app, &o.common, a.argc(), a.argv.data());
  std::cout.rdbuf(old);
  CHECK(rc == 0);
}
