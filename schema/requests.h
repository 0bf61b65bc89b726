// Contract 3's requests (schema/worker.capnp ToWorker / FromWorker) as plain structs, and
// their one codec: what a router sends a worker (Generate, Cancel) and what it hears back
// (Delta, Error), one ZMQ frame each. The router encodes requests and decodes answers
// (router/fleet); the worker decodes requests and encodes answers (worker/server); each
// side's tests speak the other's part. Registration (Hello, Bye) is schema/registration.h.
//
// Decoding never trusts its input: a frame that does not decode, or is of a kind this
// schema does not know, is DataLoss, never a crash.
//
// Thread safety: values and pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <string>
#include <variant>
#include <vector>

#include "common/block_hash.h"
#include "common/status.h"
#include "schema/kv_event.h"
#include "schema/registration.h"
#include "schema/sampling.h"

namespace kvfleet {

// A request's kv_retention.token_ranges: at most this many.
inline constexpr size_t kMaxRetentionRanges = 64;

struct RetentionRange {
  uint32_t start = 0;
  std::optional<uint32_t> end;              // exclusive; none: to the end
  uint8_t priority = kv::kDefaultPriority;  // 0..100
  std::optional<uint64_t> duration_ms;
};

struct Retention {
  std::vector<RetentionRange> ranges;
  std::optional<uint8_t> decode_priority;
  std::optional<uint64_t> decode_duration_ms;
};

// A token's logprob under the raw logits and the most likely tokens at its position.
struct TokenLogprob {
  TokenId token = 0;
  float logprob = 0.0f;
  std::vector<std::pair<TokenId, float>> top;  // descending logprob
};

// Contract 3's PullHint: the holder a worker pulls the prompt's cached prefix from.
struct PullHint {
  std::string source;      // the holder's transfer endpoint; empty: no pull
  std::string server_key;  // the holder's CURVE key (Z85); empty: plain TCP
  uint32_t blocks = 0;     // leading prompt blocks the holder is believed to hold
  std::string worker_id;
  uint32_t deadline_ms = 0;  // give up after this long; 0: the worker's own bound

  bool operator==(const PullHint&) const = default;
};

struct GenerateParams {
  std::vector<TokenId> tokens;
  SamplingParams sampling;  // schema/sampling.h
  Retention retention;
  std::string lora;
  std::string cache_salt;
  std::string model;
  PullHint pull;
};

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };

struct WorkerUsage {
  uint32_t prompt_tokens = 0;
  uint32_t cached_device_tokens = 0;
  uint32_t cached_host_tokens = 0;
  uint32_t completion_tokens = 0;
  uint64_t time_to_first_token_us = 0;  // measured inside the worker
};

struct WorkerDelta {
  uint64_t request_id = 0;
  uint32_t index = 0;  // the sequence, 0..n-1; finish is that sequence's
  std::vector<TokenId> tokens;
  FinishReason finish = FinishReason::kNone;
  WorkerUsage usage;
  std::vector<TokenLogprob> logprobs;         // one per token of `tokens` when asked for
  std::vector<TokenLogprob> prompt_logprobs;  // prompt tokens 1..n-1, first delta only
};

// schema/worker.capnp's ErrorCode, value for value.
enum class WorkerErrorCode : uint8_t {
  kInvalidRequest = 0,
  kContextTooLong,
  kUnknownLora,
  kOverloaded,    // queue full: retry elsewhere
  kShuttingDown,
  kInternal,
  kUnknownModel,
};

struct WorkerError {
  uint64_t request_id = 0;
  WorkerErrorCode code = WorkerErrorCode::kInternal;
  std::string message;
};

// The answer to a LoadLora or UnloadLora of the same request_id.
struct WorkerLoraResult {
  uint64_t request_id = 0;
  bool ok = false;
  WorkerErrorCode code = WorkerErrorCode::kInternal;  // when !ok
  std::string message;                                // when !ok
};

using FromWorkerMessage = std::variant<WorkerDelta, WorkerError, WorkerLoraResult>;

// A LoRA adapter to load (from `path`, a PEFT directory on the worker) or unload.
struct LoraControl {
  std::string name;  // the name requests select it by
  std::string path;  // kLoadLora only
};

struct ToWorkerMessage {
  enum class Kind : uint8_t { kGenerate, kCancel, kLoadLora, kUnloadLora };
  Kind kind = Kind::kGenerate;
  uint64_t request_id = 0;
  GenerateParams params;  // kGenerate
  LoraControl lora;       // kLoadLora, kUnloadLora
};

// The router's side.
std::string EncodeGenerate(uint64_t request_id, const GenerateParams& params);
std::string EncodeCancel(uint64_t request_id);
std::string EncodeLoadLora(uint64_t request_id, const LoraControl& lora);
std::string EncodeUnloadLora(uint64_t request_id, const std::string& name);
Result<FromWorkerMessage> DecodeFromWorker(const void* data, size_t size);

// The worker's side.
Result<ToWorkerMessage> DecodeToWorker(const void* data, size_t size);
// The request id of a Generate frame that DecodeToWorker refuses (a list over its bound, a field
// it cannot read), so the worker can answer it with an error instead of leaving the router to
// time out; 0 when not even that can be read, or the frame is not a Generate.
uint64_t ReadGenerateRequestId(const void* data, size_t size);
std::string EncodeDelta(const WorkerDelta& delta);
std::string EncodeError(const WorkerError& error);
std::string EncodeLoraResult(const WorkerLoraResult& result);

}  // namespace kvfleet
