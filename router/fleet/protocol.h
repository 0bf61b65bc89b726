// Contract 3 (schema/worker.capnp) as plain structs: what the router sends a worker and
// what it hears back, encoded to / decoded from one ZMQ frame each.
//
// Thread safety: values and pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common/block_hash.h"
#include "common/status.h"
#include "schema/registration.h"

namespace kvfleet::router {

struct RetentionRange {
  uint32_t start = 0;
  std::optional<uint32_t> end;           // exclusive; none: to the end
  uint8_t priority = 35;                 // 0..100
  std::optional<uint64_t> duration_ms;
};

struct Retention {
  std::vector<RetentionRange> ranges;
  std::optional<uint8_t> decode_priority;
  std::optional<uint64_t> decode_duration_ms;
};

struct SamplingParams {
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;
  std::optional<uint64_t> seed;
  uint32_t max_tokens = 16;
  std::vector<TokenId> stop_token_ids;
  bool ignore_eos = false;
};

struct GenerateParams {
  std::vector<TokenId> tokens;
  SamplingParams sampling;
  Retention retention;
  std::string lora;
  std::string cache_salt;
  std::string model;
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
  std::vector<TokenId> tokens;
  FinishReason finish = FinishReason::kNone;
  WorkerUsage usage;
};

enum class WorkerErrorCode { kInvalidRequest, kContextTooLong, kUnknownLora, kOverloaded, kShuttingDown, kInternal,
                             kUnknownModel };

struct WorkerError {
  uint64_t request_id = 0;
  WorkerErrorCode code = WorkerErrorCode::kInternal;
  std::string message;
};

using FromWorkerMessage = std::variant<WorkerDelta, WorkerError>;

// A worker's registration (Hello) or farewell (Bye): kvfleet::WorkerHello, WorkerBye,
// EncodeHello, EncodeBye and DecodeToRouter, shared with the worker (schema/registration.h).

std::string EncodeGenerate(uint64_t request_id, const GenerateParams& params);
std::string EncodeCancel(uint64_t request_id);
Result<FromWorkerMessage> DecodeFromWorker(const void* data, size_t size);

// For tests (a fake worker speaks the other side).
struct ToWorkerMessage {
  bool cancel = false;
  uint64_t request_id = 0;
  GenerateParams params;  // when !cancel
};
Result<ToWorkerMessage> DecodeToWorker(const void* data, size_t size);
std::string EncodeDelta(const WorkerDelta& delta);
std::string EncodeError(const WorkerError& error);

}  // namespace kvfleet::router
