#include "common/config.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

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

TEST_CASE("the environment variable of an option follows one rule") {
  CHECK(EnvNameFor("block-size") == "KVFLEET_BLOCK_SIZE");
  CHECK(EnvNameFor("log-level") == "KVFLEET_LOG_LEVEL");
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
