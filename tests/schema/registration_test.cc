// schema/registration.h: the one Hello/Bye encoding, used by workers and routers alike.
#include "schema/registration.h"

#include "common/block_hash.h"
#include "schema/describe.h"
#include "schema/requests.h"
#include "schema/limits.h"
#include "schema/wire.h"
#include "schema/worker.capnp.h"

#include <capnp/message.h>

#include <doctest/doctest.h>

namespace kvfleet {

TEST_CASE("Hello and Bye round-trip through the shared encoding") {
  WorkerHello h;
  h.name = "w1";
  h.model = "llama";
  h.block_size = 32;
  h.max_context = 8192;
  h.device_blocks = 1000;
  h.host_blocks = 4000;
  h.requests_endpoint = "tcp://10.0.0.5:5556";
  h.events_endpoint = "tcp://10.0.0.5:5557";
  h.replay_endpoint = "tcp://10.0.0.5:5558";
  h.http_endpoint = "http://10.0.0.5:9400";
  h.backend = "cuda";
  h.epoch = 77;
  h.tokenizer_digest = 0x8badf00ddeadbeefULL;
  h.loras = {{"sql-lora", LoraId("sql-lora"), 16, "meta-llama/Llama-3.1-8B"}, {"chat", LoraId("chat"), 64, ""}};
  h.max_loras = 4;
  h.lora_load_us = 1800;
  h.tensor_parallel = 2;
  h.transfer_endpoint = "tcp://10.0.0.5:5559";
  h.transfer_key = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7";
  h.transfer_format = "bf16";
  h.transfer_bytes_per_block = 4u << 20;
  h.transfer_host_id = "6f1c2d4e-boot";
  h.prefill_tokens_per_second = 1999.5f;
  std::string frame = EncodeHello(h);
  auto decoded = DecodeToRouter(frame.data(), frame.size());
  REQUIRE(decoded.ok());
  REQUIRE(std::holds_alternative<WorkerHello>(*decoded));
  const auto& got = std::get<WorkerHello>(*decoded);
  CHECK(got.name == "w1");
  CHECK(got.model == "llama");
  CHECK(got.block_size == 32);
  CHECK(got.loras == h.loras);
  CHECK(got.max_loras == 4);
  CHECK(got.transfer_endpoint == h.transfer_endpoint);
  CHECK(got.transfer_key == h.transfer_key);
  CHECK(got.transfer_format == "bf16");
  CHECK(got.transfer_bytes_per_block == 4u << 20);
  CHECK(got.transfer_host_id == "6f1c2d4e-boot");
  CHECK(got.prefill_tokens_per_second == 1999.5f);
  CHECK(got.lora_load_us == 1800);
  CHECK(got.tensor_parallel == 2);
  CHECK(got.max_context == 8192);
  CHECK(got.device_blocks == 1000);
  CHECK(got.host_blocks == 4000);
  CHECK(got.requests_endpoint == h.requests_endpoint);
  CHECK(got.events_endpoint == h.events_endpoint);
  CHECK(got.replay_endpoint == h.replay_endpoint);
  CHECK(got.http_endpoint == h.http_endpoint);
  CHECK(got.backend == "cuda");
  CHECK(got.epoch == 77);
  CHECK(got.tokenizer_digest == 0x8badf00ddeadbeefULL);
  CHECK(got.kv_pools.empty());  // none announced: a router assumes one full-attention pool
  CHECK(got.kv_block_size == 0);  // not token-level: KV blocks are block_size tokens
  h.kv_block_size = 1;
  frame = EncodeHello(h);
  decoded = DecodeToRouter(frame.data(), frame.size());
  REQUIRE(decoded.ok());
  CHECK(std::get<WorkerHello>(*decoded).kv_block_size == 1);
  h.kv_block_size = 0;

  h.kv_pools = {KvPoolAnnounce{0, 0, false, 0, 8, 600, 2000, true, 0},
                KvPoolAnnounce{4096, 4, true, 0, 24, 400, 2000, true, 4096}};
  frame = EncodeHello(h);
  decoded = DecodeToRouter(frame.data(), frame.size());
  REQUIRE(decoded.ok());
  CHECK(std::get<WorkerHello>(*decoded).kv_pools == h.kv_pools);

  h.host_blocks = 0;  // no host tier
  frame = EncodeHello(h);
  decoded = DecodeToRouter(frame.data(), frame.size());
  REQUIRE(decoded.ok());
  CHECK(std::get<WorkerHello>(*decoded).host_blocks == 0);

  frame = EncodeBye(WorkerBye{"w1", 77});
  decoded = DecodeToRouter(frame.data(), frame.size());
  REQUIRE(decoded.ok());
  REQUIRE(std::holds_alternative<WorkerBye>(*decoded));
  CHECK(std::get<WorkerBye>(*decoded).name == "w1");
  CHECK(std::get<WorkerBye>(*decoded).epoch == 77);
}

TEST_CASE("a Describe asks a worker for the Hello it answers on the requests connection") {
  const std::string ask = EncodeDescribe();
  CHECK(IsDescribe(ask.data(), ask.size()));
  const std::string cancel = EncodeCancel(7);
  CHECK_FALSE(IsDescribe(cancel.data(), cancel.size()));
  CHECK_FALSE(IsDescribe("junk", 4));
  // Requests' decoding does not know it: a worker older than Describe drops it as malformed.
  CHECK(DecodeToWorker(ask.data(), ask.size()).status().code() == StatusCode::kDataLoss);

  WorkerHello h;
  h.name = "gpu-7";
  h.model = "llama";
  h.block_size = 16;
  h.kv_block_size = 1;
  h.max_context = 131072;
  h.requests_endpoint = "tcp://gpu-7.internal:5556";
  h.events_endpoint = "tcp://gpu-7.internal:5557";
  h.backend = "cuda";
  h.epoch = 9;
  h.kv_pools = {KvPoolAnnounce{0, 0, false, 0, 32, 900, 0, true, 0}};
  const std::string answer = EncodeDescribed(h);
  auto got = DecodeDescribed(answer.data(), answer.size());
  REQUIRE(got.ok());
  CHECK(got->name == "gpu-7");
  CHECK(got->model == "llama");
  CHECK(got->block_size == 16);
  CHECK(got->kv_block_size == 1);
  CHECK(got->max_context == 131072);
  CHECK(got->events_endpoint == h.events_endpoint);
  CHECK(got->kv_pools == h.kv_pools);
  CHECK(got->epoch == 9);

  // Only a Hello answers a Describe: a Delta, a registration frame or junk is an error.
  const std::string delta = EncodeDelta(WorkerDelta{});
  CHECK(DecodeDescribed(delta.data(), delta.size()).status().code() == StatusCode::kDataLoss);
  const std::string junk = "not capnp at all";
  CHECK_FALSE(DecodeDescribed(junk.data(), junk.size()).ok());
  // Nor is a FromWorker Hello a Delta to the lanes that read requests' answers.
  CHECK_FALSE(DecodeFromWorker(answer.data(), answer.size()).ok());
}

TEST_CASE("a frame that is not a ToRouter message is an error") {
  std::string junk = "not capnp at all";
  CHECK(!DecodeToRouter(junk.data(), junk.size()).ok());
  CHECK(!DecodeToRouter(nullptr, 0).ok());
}

TEST_CASE("a router indexes the pool a prefix hit is limited by") {
  WorkerHello h;
  CHECK(IndexedWindow(h) == 0);  // a worker older than kvPools: full attention
  auto pool = [](uint32_t window, bool reuse, uint32_t reuse_tokens) {
    KvPoolAnnounce p;
    p.window = window;
    p.reuse = reuse;
    p.reuse_tokens = reuse_tokens;
    return p;
  };
  h.kv_pools = {pool(0, true, 0)};
  CHECK(IndexedWindow(h) == 0);
  CHECK(IndexedReuseTokens(h) == 0);  // no limit
  // Mistral-7B: every layer windowed (4096 of a 32K context): its one windowed pool.
  h.kv_pools = {pool(4096, true, 4096)};
  CHECK(IndexedWindow(h) == 4096);
  CHECK(IndexedReuseTokens(h) == 4096);  // its first window
  // Mixed layers: a hit needs every pool, and the windowed one stores only its first window.
  h.kv_pools = {pool(0, true, 0), pool(1024, true, 1024), pool(4096, true, 4096)};
  CHECK(IndexedWindow(h) == 1024);
  CHECK(IndexedReuseTokens(h) == 1024);
  // Chunked attention limits the full pool as much as the window: the smaller window wins ties.
  h.kv_pools = {pool(0, true, 8192), pool(16384, true, 8192)};
  CHECK(IndexedWindow(h) == 0);
  CHECK(IndexedReuseTokens(h) == 8192);
  // No pool stores blocks (reuse off): nothing to index but the default.
  h.kv_pools = {pool(4096, false, 4096)};
  CHECK(IndexedWindow(h) == 0);
}

TEST_CASE("a Hello without tensorParallel (a worker older than the field) reads as one rank") {
  WorkerHello h;
  h.name = "old";
  h.model = "llama";
  h.block_size = 16;
  h.tensor_parallel = 0;  // what an older worker's frame holds: the field unset
  const std::string frame = EncodeHello(h);
  auto decoded = DecodeToRouter(frame.data(), frame.size());
  REQUIRE(decoded.ok());
  CHECK(std::get<WorkerHello>(*decoded).tensor_parallel == 1);
}

TEST_CASE("a worker's role round-trips in its Hello, and reads as both from older or newer workers") {
  WorkerHello h;
  h.name = "p0";
  h.model = "llama";
  h.block_size = 16;
  for (WorkerRole role : {WorkerRole::kBoth, WorkerRole::kPrefill, WorkerRole::kDecode}) {
    h.role = role;
    const std::string frame = EncodeHello(h);
    auto decoded = DecodeToRouter(frame.data(), frame.size());
    REQUIRE(decoded.ok());
    CHECK(std::get<WorkerHello>(*decoded).role == role);
  }
  // A Hello from a worker older than the field: role unset.
  capnp::MallocMessageBuilder old;
  auto o = old.initRoot<schema::ToRouter>().initHello();
  o.setWorkerId("old");
  o.setModel("llama");
  o.setBlockSize(16);
  std::string frame = wire::Encode(old);
  auto decoded = DecodeToRouter(frame.data(), frame.size());
  REQUIRE(decoded.ok());
  CHECK(std::get<WorkerHello>(*decoded).role == WorkerRole::kBoth);
  // An enumerant this router does not know (a newer worker's role) reads as both.
  o.setRole(static_cast<schema::WorkerRole>(9));
  frame = wire::Encode(old);
  decoded = DecodeToRouter(frame.data(), frame.size());
  REQUIRE(decoded.ok());
  CHECK(std::get<WorkerHello>(*decoded).role == WorkerRole::kBoth);
}

TEST_CASE("a role's name parses back, and an unknown one is an error naming the accepted values") {
  for (WorkerRole role : {WorkerRole::kBoth, WorkerRole::kPrefill, WorkerRole::kDecode}) {
    auto parsed = ParseWorkerRole(WorkerRoleName(role));
    REQUIRE(parsed.ok());
    CHECK(*parsed == role);
  }
  auto bad = ParseWorkerRole("prefil");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("prefill, decode or both") != std::string::npos);
  CHECK_FALSE(ServesDecode(WorkerRole::kPrefill));
  CHECK(ServesDecode(WorkerRole::kDecode));
  CHECK(ServesDecode(WorkerRole::kBoth));
}

TEST_CASE("a worker's structured-outputs capability round-trips in its Hello, and is off from older workers") {
  WorkerHello h;
  h.name = "w0";
  h.model = "llama";
  h.block_size = 16;
  for (bool on : {true, false}) {
    h.structured_outputs = on;
    const std::string frame = EncodeHello(h);
    auto decoded = DecodeToRouter(frame.data(), frame.size());
    REQUIRE(decoded.ok());
    CHECK(std::get<WorkerHello>(*decoded).structured_outputs == on);
  }
  // A Hello from a worker older than the field offers no constrained decoding.
  capnp::MallocMessageBuilder old;
  auto o = old.initRoot<schema::ToRouter>().initHello();
  o.setWorkerId("old");
  o.setModel("llama");
  o.setBlockSize(16);
  const std::string frame = wire::Encode(old);
  auto decoded = DecodeToRouter(frame.data(), frame.size());
  REQUIRE(decoded.ok());
  CHECK_FALSE(std::get<WorkerHello>(*decoded).structured_outputs);
}

TEST_CASE("a Hello with more KV pools or adapters than Contract 3 allows is refused before they are read") {
  capnp::MallocMessageBuilder message;
  auto h = message.initRoot<schema::ToRouter>().initHello();
  h.setWorkerId("w");
  h.initKvPools(wire::limits::kMaxKvPools + 1);
  std::string frame = wire::Encode(message);
  auto got = DecodeToRouter(frame.data(), frame.size());
  REQUIRE_FALSE(got.ok());
  CHECK(got.status().code() == StatusCode::kOutOfRange);
  h.initKvPools(1);
  h.initLoras(wire::limits::kMaxLoraAdapters + 1);
  frame = wire::Encode(message);
  got = DecodeToRouter(frame.data(), frame.size());
  REQUIRE_FALSE(got.ok());
  CHECK(got.status().code() == StatusCode::kOutOfRange);
  // The same Hello answering a Describe.
  capnp::MallocMessageBuilder described;
  described.initRoot<schema::FromWorker>().initHello().initLoras(wire::limits::kMaxLoraAdapters + 1);
  frame = wire::Encode(described);
  CHECK(DecodeDescribed(frame.data(), frame.size()).status().code() == StatusCode::kOutOfRange);
}

}  // namespace kvfleet
