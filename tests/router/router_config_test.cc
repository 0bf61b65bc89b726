// RouterConfig's per-model options: --workers, --workers-dns, --block-size, --max-context,
// --tokenizer and --chat-template as VALUE or MODEL=VALUE, the gossip options, and the
// start-up error each mistake gets (naming its option).
#include "router/router_config.h"

#include <filesystem>
#include <fstream>

#include <doctest/doctest.h>

#include "common/curve_keys.h"

namespace kvfleet::router {
namespace {

namespace fs = std::filesystem;

// Parses `args` as kvfleet-router's command line and prepares the config.
Status Parse(std::vector<std::string> args, RouterConfig* c) {
  CLI::App app;
  AddOptions(app, c);
  std::vector<std::string> argv = {"kvfleet-router"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> ptrs;
  for (auto& a : argv) ptrs.push_back(a.data());
  try {
    app.parse(static_cast<int>(ptrs.size()), ptrs.data());
  } catch (const CLI::ParseError& e) {
    return InvalidArgument(e.what());
  }
  return Prepare(c);
}

std::string ErrorOf(std::vector<std::string> args) {
  RouterConfig c;
  Status st = Parse(std::move(args), &c);
  return st.ok() ? std::string("(ok)") : std::string(st.message());
}

const StaticFleet* FleetOf(const RouterConfig& c, const std::string& model) {
  for (const auto& f : c.fleet.static_fleets) {
    if (f.model == model) return &f;
  }
  return nullptr;
}

// A scratch directory with two tokenizer directories and a template file.
struct Dirs {
  Dirs() : root(fs::temp_directory_path() / ("kvfleet_router_config_test_" + std::to_string(::getpid()))) {
    fs::create_directories(root / "a");
    fs::create_directories(root / "b");
    std::ofstream(root / "t.jinja") << "{{ messages[0].content }}";
  }
  ~Dirs() { fs::remove_all(root); }
  std::string a() const { return (root / "a").string(); }
  std::string b() const { return (root / "b").string(); }
  std::string tmpl() const { return (root / "t.jinja").string(); }
  fs::path root;
};

}  // namespace

TEST_CASE("plain --workers and --workers-dns belong to --model, with the plain sizes") {
  RouterConfig c;
  REQUIRE(Parse({"--workers", "tcp://h:1,tcp://h:4", "--workers-dns", "svc:5556", "--model", "llama", "--block-size",
                 "16", "--max-context", "4096"},
                &c)
              .ok());
  REQUIRE(c.fleet.static_fleets.size() == 1);
  const StaticFleet& f = c.fleet.static_fleets[0];
  CHECK(f.model == "llama");
  CHECK(f.workers == std::vector<std::string>{"tcp://h:1", "tcp://h:4"});
  CHECK(f.dns_names == std::vector<std::string>{"svc:5556"});
  CHECK(f.block_size == 16);
  CHECK(f.max_context == 4096);
  CHECK(c.fleet.AllStaticFleets().size() == 1);  // the flat fields stay empty
}

TEST_CASE("MODEL= forms give each model its own workers, DNS names and sizes; the plain size is the default") {
  RouterConfig c;
  REQUIRE(Parse({"--workers", "llama=tcp://a:1,tcp://a:4", "--workers", "qwen=tcp://b:1", "--workers-dns",
                 "qwen=qwen-svc:5556", "--workers-dns", "mistral=m:7", "--block-size", "16", "--block-size", "qwen=64",
                 "--max-context", "mistral=1024"},
                &c)
              .ok());
  REQUIRE(c.fleet.static_fleets.size() == 3);
  const StaticFleet* llama = FleetOf(c, "llama");
  const StaticFleet* qwen = FleetOf(c, "qwen");
  const StaticFleet* mistral = FleetOf(c, "mistral");
  REQUIRE((llama && qwen && mistral));
  CHECK(llama->workers == std::vector<std::string>{"tcp://a:1", "tcp://a:4"});
  CHECK(llama->block_size == 16);
  CHECK(llama->max_context == 8192);
  CHECK(qwen->workers == std::vector<std::string>{"tcp://b:1"});
  CHECK(qwen->dns_names == std::vector<std::string>{"qwen-svc:5556"});
  CHECK(qwen->block_size == 64);
  CHECK(mistral->workers.empty());
  CHECK(mistral->dns_names == std::vector<std::string>{"m:7"});
  CHECK(mistral->max_context == 1024);
}

TEST_CASE("the environment gives the plain form, and several values split at ';'") {
  RouterConfig c;
  CLI::App app;
  AddOptions(app, &c);
  BindEnvironment(app);
  ::setenv("KVFLEET_WORKERS", "tcp://e:1,tcp://e:4", 1);
  ::setenv("KVFLEET_WORKERS_DNS", "a=svc-a:1;b=svc-b:2", 1);
  std::vector<std::string> argv = {"kvfleet-router", "--model", "env"};
  std::vector<char*> ptrs;
  for (auto& a : argv) ptrs.push_back(a.data());
  app.parse(static_cast<int>(ptrs.size()), ptrs.data());
  ::unsetenv("KVFLEET_WORKERS");
  ::unsetenv("KVFLEET_WORKERS_DNS");
  REQUIRE(Prepare(&c).ok());
  REQUIRE(c.fleet.static_fleets.size() == 3);
  REQUIRE(FleetOf(c, "env"));
  CHECK(FleetOf(c, "env")->workers.size() == 2);
  REQUIRE((FleetOf(c, "a") && FleetOf(c, "b")));
  CHECK(FleetOf(c, "a")->dns_names == std::vector<std::string>{"svc-a:1"});
  CHECK(FleetOf(c, "b")->dns_names == std::vector<std::string>{"svc-b:2"});
}

TEST_CASE("bad static and DNS worker options stop the router, naming the option") {
  CHECK(ErrorOf({"--workers", "=tcp://a:1"}).find("--workers =tcp://a:1: expected MODEL=VALUE") == 0);
  CHECK(ErrorOf({"--workers", "llama="}).find("--workers llama=: expected MODEL=VALUE") == 0);
  CHECK(ErrorOf({"--workers", "a:1"}).find("--workers a:1: 'a:1' is not an endpoint (tcp://HOST:PORT)") == 0);
  CHECK(ErrorOf({"--workers", "x=tcp://a:1", "--workers", "y=tcp://a:1"})
            .find("tcp://a:1 is listed twice (models 'x' and 'y')") != std::string::npos);
  CHECK(ErrorOf({"--workers-dns", "m=svc"}).find("--workers-dns m=svc: 'svc' is not HOST:PORT") == 0);
  CHECK(ErrorOf({"--workers-dns", "svc:p"}).find("is not HOST:PORT") != std::string::npos);
  CHECK(ErrorOf({"--workers-dns", "a=s:1", "--workers-dns", "b=s:1"}).find("s:1 is given twice") != std::string::npos);
  CHECK(ErrorOf({"--workers", "tcp://a:1", "--block-size", "12"}).find("--block-size: 12 (model 'default') is not a "
                                                                        "power of two") == 0);
  CHECK(ErrorOf({"--block-size", "x"}).find("--block-size x: 'x' is not a positive integer") == 0);
  CHECK(ErrorOf({"--max-context", "m=0"}).find("--max-context m=0: '0' is not a positive integer") == 0);
  CHECK(ErrorOf({"--block-size", "16", "--block-size", "32"}).find("a plain value is given twice") !=
        std::string::npos);
  // A size for a model that has no static or DNS workers would do nothing.
  CHECK(ErrorOf({"--workers", "tcp://a:1", "--block-size", "qwen=16"})
            .find("--block-size qwen=16: model 'qwen' has no --workers or --workers-dns") == 0);
}

TEST_CASE("--tokenizer and --chat-template per model: the plain ones are the default of every other model") {
  Dirs d;
  RouterConfig c;
  REQUIRE(Parse({"--tokenizer", d.a(), "--tokenizer", "qwen=" + d.b(), "--chat-template", "llama=" + d.tmpl()}, &c)
              .ok());
  REQUIRE(c.tokenizers.size() == 3);  // by model: "" (the default), llama, qwen
  CHECK(c.tokenizers[0].model.empty());
  CHECK(c.tokenizers[0].dir == d.a());
  CHECK_FALSE(c.tokenizers[0].chat_template);
  // llama has only its own template: the default directory, with it.
  CHECK(c.tokenizers[1].model == "llama");
  CHECK(c.tokenizers[1].dir == d.a());
  CHECK(c.tokenizers[1].chat_template == std::optional<std::string>("{{ messages[0].content }}"));
  CHECK(c.tokenizers[2].model == "qwen");
  CHECK(c.tokenizers[2].dir == d.b());
}

TEST_CASE("bad tokenizer options stop the router, naming the option") {
  Dirs d;
  CHECK(ErrorOf({"--tokenizer", d.root.string() + "/none"}).find("--tokenizer " + d.root.string() + "/none: ") == 0);
  CHECK(ErrorOf({"--tokenizer", "m=" + d.a(), "--tokenizer", "m=" + d.b()}).find("model 'm' is given twice") !=
        std::string::npos);
  CHECK(ErrorOf({"--tokenizer", d.a(), "--tokenizer", d.b()}).find("a plain --tokenizer is given twice") !=
        std::string::npos);
  CHECK(ErrorOf({"--chat-template", d.tmpl()}) ==
        "--chat-template needs --tokenizer: the byte codec renders chats as plain text");
  // A plain template with only per-model tokenizers: which model's is it?
  CHECK(ErrorOf({"--tokenizer", "m=" + d.a(), "--chat-template", d.tmpl()})
            .find("no --tokenizer for the plain --chat-template") != std::string::npos);
  CHECK(ErrorOf({"--tokenizer", "m=" + d.a(), "--chat-template", "n=" + d.tmpl()}).find("no --tokenizer for model 'n'") !=
        std::string::npos);
  CHECK(ErrorOf({"--tokenizer", d.a(), "--chat-template", "m=" + d.root.string() + "/none.jinja"})
            .find("cannot read the file") != std::string::npos);
}

TEST_CASE("--allow-unknown-fields is off by default, a flag on the command line, and KVFLEET_ALLOW_UNKNOWN_FIELDS") {
  RouterConfig off;
  REQUIRE(Parse({}, &off).ok());
  CHECK_FALSE(off.api.limits.fields.allow_unknown);
  RouterConfig on;
  REQUIRE(Parse({"--allow-unknown-fields"}, &on).ok());
  CHECK(on.api.limits.fields.allow_unknown);
  RouterConfig env;
  CLI::App app;
  AddOptions(app, &env);
  BindEnvironment(app);
  ::setenv("KVFLEET_ALLOW_UNKNOWN_FIELDS", "true", 1);
  std::vector<std::string> argv = {"kvfleet-router"};
  std::vector<char*> ptrs;
  for (auto& a : argv) ptrs.push_back(a.data());
  app.parse(static_cast<int>(ptrs.size()), ptrs.data());
  ::unsetenv("KVFLEET_ALLOW_UNKNOWN_FIELDS");
  REQUIRE(Prepare(&env).ok());
  CHECK(env.api.limits.fields.allow_unknown);
}

TEST_CASE("--http-max-connections sets the server's connection cap: 4096 by default, positive") {
  RouterConfig plain;
  REQUIRE(Parse({}, &plain).ok());
  CHECK(plain.http.max_connections == 4096);
  RouterConfig set;
  REQUIRE(Parse({"--http-max-connections", "100"}, &set).ok());
  CHECK(set.http.max_connections == 100);
  CHECK(ErrorOf({"--http-max-connections", "0"}).find("--http-max-connections") != std::string::npos);
}

TEST_CASE("--max-workers and --forget-after-s size the fleet; the socket and open-file needs follow them") {
  RouterConfig c;
  REQUIRE(Parse({"--max-workers", "100", "--forget-after-s", "5", "--http-threads", "4"}, &c).ok());
  CHECK(c.fleet.max_workers == 100);
  CHECK(c.fleet.forget_after == 5 * kNsPerSec);
  CHECK(c.fleet.lanes == 5);  // four HTTP lanes and Submit's
  CHECK(c.fleet.SocketsPerWorker() == config::kFleetSocketsPerWorker + 5);
  CHECK(c.fleet.MaxSockets() == 100 * (config::kFleetSocketsPerWorker + 5) + config::kFleetSocketHeadroom);
  CHECK(OpenFilesWanted(c) > 100 * c.fleet.SocketsPerWorker());
  CHECK(ErrorOf({"--max-workers", "0"}).find("--max-workers must be 1..1024") == 0);
  CHECK(ErrorOf({"--max-workers", "1025"}).find("--max-workers must be 1..1024") == 0);
  CHECK(ErrorOf({"--forget-after-s", "0"}) == "--forget-after-s must be > 0");
  CHECK(ErrorOf({"--workers", "tcp://a:1", "--max-context", "2000000"}).find("--max-context: 2000000") == 0);
}

TEST_CASE("--metrics-need-key needs API keys to ask for") {
  CHECK(ErrorOf({"--metrics-need-key"}).find("--api-key-file") != std::string::npos);
  CHECK(ErrorOf({"--cache-salt-per-key"}).find("--api-key-file") != std::string::npos);
}

}  // namespace kvfleet::router

namespace kvfleet::router {

TEST_CASE("gossip options: a peer list turns gossip on, and each contradiction names its flag") {
  RouterConfig c;
  REQUIRE(Parse({"--peer-routers", "tcp://127.0.0.1:5560,tcp://127.0.0.1:5561", "--gossip-interval-ms", "20",
                 "--gossip-ttl-ms", "500"},
                &c)
              .ok());
  CHECK(c.gossip.peers == std::vector<std::string>{"tcp://127.0.0.1:5560", "tcp://127.0.0.1:5561"});
  CHECK(c.gossip.interval == 20 * kNsPerMs);
  CHECK(c.gossip.ttl == 500 * kNsPerMs);
  RouterConfig none;
  REQUIRE(Parse({}, &none).ok());
  CHECK(none.gossip.peers.empty());  // no peers: no gossip, today's behaviour
  CHECK(ErrorOf({"--peer-routers", "10.0.0.2:5560"}).find("--peer-routers") != std::string::npos);
  CHECK(ErrorOf({"--peer-routers", "tcp://127.0.0.1:5561", "--gossip-interval-ms", "100", "--gossip-ttl-ms", "100"})
            .find("--gossip-ttl-ms") != std::string::npos);
  CHECK(ErrorOf({"--peer-routers", "tcp://127.0.0.1:5561", "--gossip-keypair", "/no/such/file"}) != "(ok)");
}

TEST_CASE("gossip options: changes are sent at once, at most one per --gossip-min-gap-us, unless turned off") {
  RouterConfig c;
  REQUIRE(Parse({"--peer-routers", "tcp://127.0.0.1:5561"}, &c).ok());
  CHECK(c.gossip.on_change);
  CHECK(c.gossip.min_gap == config::kGossipMinGap);
  RouterConfig off;
  REQUIRE(Parse({"--peer-routers", "tcp://127.0.0.1:5561", "--gossip-on-change=false", "--gossip-min-gap-us", "250"},
                &off)
              .ok());
  CHECK_FALSE(off.gossip.on_change);
  CHECK(off.gossip.min_gap == 250 * kNsPerUs);
  CHECK(ErrorOf({"--peer-routers", "tcp://127.0.0.1:5561", "--gossip-min-gap-us", "-1"}).find("--gossip-min-gap-us") !=
        std::string::npos);
  CHECK(ErrorOf({"--peer-routers", "tcp://127.0.0.1:5561", "--gossip-min-gap-us", "20000"})
            .find("--gossip-min-gap-us") != std::string::npos);
  CHECK(ErrorOf({"--peer-routers", "tcp://127.0.0.1:5561", "--gossip-on-change", "maybe"}).find("--gossip-on-change") !=
        std::string::npos);
}

TEST_CASE("gossip options: --peer-routers-dns alone turns gossip on; --debug-drop-gossip needs a channel") {
  RouterConfig c;
  REQUIRE(Parse({"--peer-routers-dns", "kvfleet-router-gossip:5560", "--dns-interval-s", "2", "--debug-drop-gossip",
                 "5:10"},
                &c)
              .ok());
  CHECK(c.gossip.peers.empty());
  CHECK(c.gossip.peers_dns == "kvfleet-router-gossip:5560");
  CHECK(c.gossip.dns_interval == 2 * kNsPerSec);
  REQUIRE(c.gossip_outage.has_value());
  CHECK(c.gossip_outage->after == 5 * kNsPerSec);
  CHECK(c.gossip_outage->length == 10 * kNsPerSec);
  CHECK(ErrorOf({"--peer-routers-dns", "tcp://router:5560"}).find("--peer-routers-dns") != std::string::npos);
  CHECK(ErrorOf({"--peer-routers-dns", "router"}).find("--peer-routers-dns") != std::string::npos);
  CHECK(ErrorOf({"--debug-drop-gossip", "5:10"}).find("--debug-drop-gossip") != std::string::npos);
  CHECK(ErrorOf({"--peer-routers-dns", "router:5560", "--debug-drop-gossip", "5"}).find("--debug-drop-gossip") !=
        std::string::npos);
  CHECK(ErrorOf({"--dns-interval-s", "0"}).find("--dns-interval-s") != std::string::npos);
}

TEST_CASE("a router whose worker sockets use CURVE gossips with CURVE too, unless told it is insecure") {
  if (!CurveAvailable()) return;
  Dirs dirs;
  const std::string keys = (dirs.root / "router.key").string(), server = (dirs.root / "server.pub").string();
  const std::string gossip = (dirs.root / "gossip.key").string();
  const CurveKeyPair pair = GenerateCurveKeyPair().value();
  REQUIRE(WriteCurveKeyPair(keys, pair).ok());
  REQUIRE(WriteCurveKeyPair(gossip, GenerateCurveKeyPair().value()).ok());
  std::ofstream(server) << pair.public_key << "\n";
  const std::vector<std::string> curve = {"--curve-keypair", keys, "--curve-server-key", server, "--peer-routers",
                                          "tcp://127.0.0.1:5561"};
  CHECK(ErrorOf(curve).find("--gossip-keypair") != std::string::npos);
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> args = curve;
    args.insert(args.end(), more.begin(), more.end());
    return ErrorOf(args);
  };
  CHECK(with({"--gossip-keypair", gossip}) == "(ok)");
  CHECK(with({"--gossip-insecure"}) == "(ok)");
}

}  // namespace kvfleet::router
