// schema/registration.h: the one Hello/Bye encoding, used by workers and routers alike.
#include "schema/registration.h"

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
  std::string frame = EncodeHello(h);
  auto decoded = DecodeToRouter(frame.data(), frame.size());
  REQUIRE(decoded.ok());
  REQUIRE(std::holds_alternative<WorkerHello>(*decoded));
  const auto& got = std::get<WorkerHello>(*decoded);
  CHECK(got.name == "w1");
  CHECK(got.model == "llama");
  CHECK(got.block_size == 32);
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

TEST_CASE("a frame that is not a ToRouter message is an error") {
  std::string junk = "not capnp at all";
  CHECK(!DecodeToRouter(junk.data(), junk.size()).ok());
  CHECK(!DecodeToRouter(nullptr, 0).ok());
}

}  // namespace kvfleet
