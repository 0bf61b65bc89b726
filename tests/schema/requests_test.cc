// schema/requests.h: Contract 3's one codec, which routers and workers both use.
#include "schema/requests.h"

#include <capnp/message.h>
#include <doctest/doctest.h>

#include "schema/limits.h"
#include "schema/wire.h"
#include "schema/worker.capnp.h"

namespace kvfleet {

TEST_CASE("a Generate round-trips through the codec with every field, retention included") {
  GenerateParams p;
  p.tokens = {1, 2, 3, 128009};
  p.sampling.temperature = 0.5f;
  p.sampling.top_p = 0.9f;
  p.sampling.top_k = 40;
  p.sampling.seed = 7;
  p.sampling.max_tokens = 99;
  p.sampling.stop_token_ids = {128001, 128009};
  p.sampling.ignore_eos = true;
  p.sampling.n = 5;
  p.sampling.presence_penalty = 0.5f;
  p.sampling.frequency_penalty = -1.25f;
  p.sampling.repetition_penalty = 1.3f;
  p.sampling.min_p = 0.05f;
  p.sampling.logit_bias = {{17, -100.0f}, {23, 4.5f}};
  p.sampling.logprobs = 5;
  p.sampling.prompt_logprobs = true;
  p.sampling.structured = {StructuredOutput::Kind::kJsonSchema, R"({"type":"object"})"};
  p.retention.ranges = {{0, 64, 100, 30'000}, {64, std::nullopt, 10, std::nullopt}};
  p.retention.decode_priority = 80;
  p.retention.decode_duration_ms = 5'000;
  p.lora = "adapter";
  p.cache_salt = "salt";
  p.model = "llama";
  p.pull = {"tcp://10.0.0.7:5559", "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7", 12, "w7", 40};
  std::string frame = EncodeGenerate(42, p);
  auto got = DecodeToWorker(frame.data(), frame.size());
  REQUIRE(got.ok());
  CHECK(got->kind == ToWorkerMessage::Kind::kGenerate);
  CHECK(got->request_id == 42);
  const GenerateParams& g = got->params;
  CHECK(g.tokens == p.tokens);
  CHECK(g.sampling.temperature == 0.5f);
  CHECK(g.sampling.top_p == 0.9f);
  CHECK(g.sampling.top_k == 40);
  CHECK(g.sampling.seed == std::optional<uint64_t>(7));
  CHECK(g.sampling.max_tokens == 99);
  CHECK(g.sampling.stop_token_ids == p.sampling.stop_token_ids);
  CHECK(g.sampling.ignore_eos);
  CHECK(g.sampling.n == 5);
  CHECK(g.sampling.presence_penalty == 0.5f);
  CHECK(g.sampling.frequency_penalty == -1.25f);
  CHECK(g.sampling.repetition_penalty == 1.3f);
  CHECK(g.sampling.min_p == 0.05f);
  CHECK(g.sampling.logit_bias == p.sampling.logit_bias);
  CHECK(g.sampling.logprobs == 5);
  CHECK(g.sampling.prompt_logprobs);
  CHECK(g.sampling.structured == StructuredOutput{StructuredOutput::Kind::kJsonSchema, R"({"type":"object"})"});
  REQUIRE(g.retention.ranges.size() == 2);
  CHECK(g.retention.ranges[0].start == 0);
  CHECK(g.retention.ranges[0].end == std::optional<uint32_t>(64));
  CHECK(g.retention.ranges[0].priority == 100);
  CHECK(g.retention.ranges[0].duration_ms == std::optional<uint64_t>(30'000));
  CHECK(g.retention.ranges[1].start == 64);
  CHECK_FALSE(g.retention.ranges[1].end.has_value());
  CHECK(g.retention.ranges[1].priority == 10);
  CHECK_FALSE(g.retention.ranges[1].duration_ms.has_value());
  CHECK(g.retention.decode_priority == std::optional<uint8_t>(80));
  CHECK(g.retention.decode_duration_ms == std::optional<uint64_t>(5'000));
  CHECK(g.lora == "adapter");
  CHECK(g.cache_salt == "salt");
  CHECK(g.model == "llama");
  CHECK(g.pull == p.pull);

  // Text fields carry every byte, a NUL included: the worker hashes the salt the router hashed
  // (a setter given the std::string itself would stop at the NUL).
  p.cache_salt = std::string("tenant-a\0x", 10);
  p.sampling.structured = {StructuredOutput::Kind::kRegex, std::string("ab\0|.*", 6)};
  frame = EncodeGenerate(43, p);
  got = DecodeToWorker(frame.data(), frame.size());
  REQUIRE(got.ok());
  CHECK(got->params.cache_salt == p.cache_salt);
  CHECK(got->params.sampling.structured.spec == p.sampling.structured.spec);

  GenerateParams plain;
  plain.tokens = {5};
  frame = EncodeGenerate(1, plain);
  got = DecodeToWorker(frame.data(), frame.size());
  REQUIRE(got.ok());
  CHECK_FALSE(got->params.sampling.seed.has_value());
  // Unset logit processing decodes as off (the schema's defaults), logprobs as none.
  CHECK(got->params.sampling.repetition_penalty == 1.0f);
  CHECK(got->params.sampling.presence_penalty == 0.0f);
  CHECK(got->params.sampling.min_p == 0.0f);
  CHECK(got->params.sampling.logit_bias.empty());
  CHECK(got->params.sampling.logprobs == -1);
  CHECK_FALSE(got->params.sampling.prompt_logprobs);
  CHECK(got->params.sampling.structured.kind == StructuredOutput::Kind::kNone);
  CHECK_FALSE(got->params.retention.decode_priority.has_value());
  CHECK_FALSE(got->params.retention.decode_duration_ms.has_value());
  CHECK(got->params.pull == PullHint{});  // no hint: the worker computes what it lacks
}

TEST_CASE("frames without n or index (an older router or worker) read as n = 1 and sequence 0") {
  capnp::MallocMessageBuilder generate;
  auto g = generate.initRoot<schema::ToWorker>().initGenerate();
  g.setRequestId(4);
  g.initTokens(1).set(0, 7);
  g.initSampling().setMaxTokens(3);  // the fields of Sampling before n
  std::string frame = wire::Encode(generate);
  auto got = DecodeToWorker(frame.data(), frame.size());
  REQUIRE(got.ok());
  CHECK(got->params.sampling.n == 1);
  CHECK(got->params.sampling.max_tokens == 3);

  capnp::MallocMessageBuilder delta;
  auto d = delta.initRoot<schema::FromWorker>().initDelta();
  d.setRequestId(4);
  d.initTokens(1).set(0, 9);
  frame = wire::Encode(delta);
  auto answer = DecodeFromWorker(frame.data(), frame.size());
  REQUIRE(answer.ok());
  REQUIRE(std::holds_alternative<WorkerDelta>(*answer));
  CHECK(std::get<WorkerDelta>(*answer).index == 0);
}

TEST_CASE("a Cancel round-trips through the codec") {
  std::string frame = EncodeCancel(9);
  auto got = DecodeToWorker(frame.data(), frame.size());
  REQUIRE(got.ok());
  CHECK(got->kind == ToWorkerMessage::Kind::kCancel);
  CHECK(got->request_id == 9);
}

TEST_CASE("LoRA control and its result round-trip through the codec") {
  std::string frame = EncodeLoadLora(21, LoraControl{"sql-lora", "/models/adapters/sql"});
  auto load = DecodeToWorker(frame.data(), frame.size());
  REQUIRE(load.ok());
  CHECK(load->kind == ToWorkerMessage::Kind::kLoadLora);
  CHECK(load->request_id == 21);
  CHECK(load->lora.name == "sql-lora");
  CHECK(load->lora.path == "/models/adapters/sql");

  frame = EncodeUnloadLora(22, "sql-lora");
  auto unload = DecodeToWorker(frame.data(), frame.size());
  REQUIRE(unload.ok());
  CHECK(unload->kind == ToWorkerMessage::Kind::kUnloadLora);
  CHECK(unload->request_id == 22);
  CHECK(unload->lora.name == "sql-lora");
  CHECK(unload->lora.path.empty());

  frame = EncodeLoraResult(WorkerLoraResult{22, false, WorkerErrorCode::kUnknownLora, "no adapter 'sql-lora'"});
  auto result = DecodeFromWorker(frame.data(), frame.size());
  REQUIRE(result.ok());
  REQUIRE(std::holds_alternative<WorkerLoraResult>(*result));
  const auto& r = std::get<WorkerLoraResult>(*result);
  CHECK(r.request_id == 22);
  CHECK_FALSE(r.ok);
  CHECK(r.code == WorkerErrorCode::kUnknownLora);
  CHECK(r.message == "no adapter 'sql-lora'");

  frame = EncodeLoraResult(WorkerLoraResult{23, true, WorkerErrorCode::kInternal, ""});
  result = DecodeFromWorker(frame.data(), frame.size());
  REQUIRE(result.ok());
  CHECK(std::get<WorkerLoraResult>(*result).ok);
}

TEST_CASE("Deltas and Errors round-trip through the codec") {
  WorkerDelta d;
  d.request_id = 3;
  d.index = 2;
  d.tokens = {10, 11};
  d.finish = FinishReason::kStop;
  d.usage = {100, 64, 32, 2, 1'234};
  std::string frame = EncodeDelta(d);
  auto got = DecodeFromWorker(frame.data(), frame.size());
  REQUIRE(got.ok());
  REQUIRE(std::holds_alternative<WorkerDelta>(*got));
  const auto& gd = std::get<WorkerDelta>(*got);
  CHECK(gd.request_id == 3);
  CHECK(gd.index == 2);
  CHECK(gd.tokens == d.tokens);
  CHECK(gd.finish == FinishReason::kStop);
  CHECK(gd.usage.prompt_tokens == 100);
  CHECK(gd.usage.cached_device_tokens == 64);
  CHECK(gd.usage.cached_host_tokens == 32);
  CHECK(gd.usage.completion_tokens == 2);
  CHECK(gd.usage.time_to_first_token_us == 1'234);
  CHECK(gd.logprobs.empty());
  CHECK(gd.prompt_logprobs.empty());

  d.logprobs = {{10, -0.25f, {{10, -0.25f}, {4, -2.0f}}}, {11, -3.5f, {}}};
  d.prompt_logprobs = {{7, -1.0f, {{8, -0.5f}}}};
  frame = EncodeDelta(d);
  got = DecodeFromWorker(frame.data(), frame.size());
  REQUIRE(got.ok());
  const auto& gl = std::get<WorkerDelta>(*got);
  REQUIRE(gl.logprobs.size() == 2);
  CHECK(gl.logprobs[0].token == 10);
  CHECK(gl.logprobs[0].logprob == -0.25f);
  CHECK(gl.logprobs[0].top == d.logprobs[0].top);
  CHECK(gl.logprobs[1].logprob == -3.5f);
  CHECK(gl.logprobs[1].top.empty());
  REQUIRE(gl.prompt_logprobs.size() == 1);
  CHECK(gl.prompt_logprobs[0].token == 7);
  CHECK(gl.prompt_logprobs[0].top == d.prompt_logprobs[0].top);

  for (WorkerErrorCode code : {WorkerErrorCode::kInvalidRequest, WorkerErrorCode::kContextTooLong,
                               WorkerErrorCode::kUnknownLora, WorkerErrorCode::kOverloaded,
                               WorkerErrorCode::kShuttingDown, WorkerErrorCode::kInternal,
                               WorkerErrorCode::kUnknownModel}) {
    frame = EncodeError(WorkerError{5, code, "why"});
    got = DecodeFromWorker(frame.data(), frame.size());
    REQUIRE(got.ok());
    REQUIRE(std::holds_alternative<WorkerError>(*got));
    CHECK(std::get<WorkerError>(*got).code == code);
    CHECK(std::get<WorkerError>(*got).request_id == 5);
    CHECK(std::get<WorkerError>(*got).message == "why");
  }
}

TEST_CASE("the codec's error codes are the schema's, value for value") {
  CHECK(static_cast<int>(WorkerErrorCode::kInvalidRequest) == static_cast<int>(schema::ErrorCode::INVALID_REQUEST));
  CHECK(static_cast<int>(WorkerErrorCode::kContextTooLong) == static_cast<int>(schema::ErrorCode::CONTEXT_TOO_LONG));
  CHECK(static_cast<int>(WorkerErrorCode::kUnknownLora) == static_cast<int>(schema::ErrorCode::UNKNOWN_LORA));
  CHECK(static_cast<int>(WorkerErrorCode::kOverloaded) == static_cast<int>(schema::ErrorCode::OVERLOADED));
  CHECK(static_cast<int>(WorkerErrorCode::kShuttingDown) == static_cast<int>(schema::ErrorCode::SHUTTING_DOWN));
  CHECK(static_cast<int>(WorkerErrorCode::kInternal) == static_cast<int>(schema::ErrorCode::INTERNAL));
  CHECK(static_cast<int>(WorkerErrorCode::kUnknownModel) == static_cast<int>(schema::ErrorCode::UNKNOWN_MODEL));
}

TEST_CASE("frames that are not Contract 3 are DataLoss, never a crash") {
  std::string garbage = "not a capnp frame at all";
  CHECK(DecodeToWorker(garbage.data(), garbage.size()).status().code() == StatusCode::kDataLoss);
  CHECK(DecodeFromWorker(garbage.data(), garbage.size()).status().code() == StatusCode::kDataLoss);
  CHECK(DecodeToWorker(nullptr, 0).status().code() == StatusCode::kDataLoss);

  // A FromWorker frame where a ToWorker is due decodes as some union member or fails; it
  // never crashes. An empty ToWorker (no union member set) is a Generate of nothing.
  std::string delta = EncodeDelta(WorkerDelta{});
  (void)DecodeToWorker(delta.data(), delta.size());

  // An Error whose code is past the ones this build knows reads as internal.
  capnp::MallocMessageBuilder msg;
  auto err = msg.initRoot<schema::FromWorker>().initError();
  err.setRequestId(1);
  err.setCode(static_cast<schema::ErrorCode>(200));
  std::string frame = wire::Encode(msg);
  auto got = DecodeFromWorker(frame.data(), frame.size());
  REQUIRE(got.ok());
  CHECK(std::get<WorkerError>(*got).code == WorkerErrorCode::kInternal);
}

TEST_CASE("a list longer than its contract's bound is refused before it is read (OutOfRange)") {
  // A struct list may claim elements of no size, taking no bytes of the frame: a 400-byte frame
  // claimed 31 million logit biases (schema_wire_fuzzer). Each list is checked against its bound
  // before the decoder reads an element. Built whole here, one past each bound.
  auto generate = [](auto fill) {
    capnp::MallocMessageBuilder message;
    auto g = message.initRoot<schema::ToWorker>().initGenerate();
    g.setRequestId(1);
    g.initTokens(1).set(0, 5);
    fill(g);
    return wire::Encode(message);
  };
  auto refused = [](const std::string& frame) {
    auto got = DecodeToWorker(frame.data(), frame.size());
    return got.ok() ? Status::Ok() : got.status();
  };
  const Status bias = refused(generate([](auto g) { g.initSampling().initLogitBias(sampling::config::kMaxLogitBias + 1); }));
  CHECK(bias.code() == StatusCode::kOutOfRange);
  CHECK(bias.message().find("logit bias: 301 entries, more than 300") != std::string::npos);
  CHECK(refused(generate([](auto g) { g.initSampling().initStopTokenIds(sampling::config::kMaxStopTokenIds + 1); }))
            .code() == StatusCode::kOutOfRange);
  CHECK(refused(generate([](auto g) { g.initRetention().initRanges(kMaxRetentionRanges + 1); })).code() ==
        StatusCode::kOutOfRange);
  CHECK(refused(generate([](auto g) { g.initTokens(wire::limits::kMaxContextTokens + 1); })).code() ==
        StatusCode::kOutOfRange);
  // At the bound: read.
  CHECK(refused(generate([](auto g) { g.initSampling().initLogitBias(sampling::config::kMaxLogitBias); })).ok());

  // A Delta's logprobs, and each one's top entries.
  capnp::MallocMessageBuilder message;
  auto d = message.initRoot<schema::FromWorker>().initDelta();
  d.initLogprobs(1)[0].initTop(sampling::config::kMaxTopLogprobs + 1);
  const std::string frame = wire::Encode(message);
  auto delta = DecodeFromWorker(frame.data(), frame.size());
  REQUIRE_FALSE(delta.ok());
  CHECK(delta.status().code() == StatusCode::kOutOfRange);
}

}  // namespace kvfleet
