#include "cli/bench/trace.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

namespace kvfleet::bench {

namespace {

Status LineError(const std::string& source, uint32_t line, const std::string& what) {
  return InvalidArgument(source + ":" + std::to_string(line) + ": " + what);
}

// Reads a non-negative integer field; false when it is missing or not one.
bool ReadCount(const nlohmann::json& obj, const char* name, int64_t* out) {
  auto it = obj.find(name);
  if (it == obj.end() || !it->is_number_integer()) return false;
  *out = it->get<int64_t>();
  return *out >= 0;
}

Result<TraceRequest> ParseLine(const std::string& text, const std::string& source, uint32_t line) {
  nlohmann::json obj = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (obj.is_discarded()) return LineError(source, line, "not valid JSON");
  if (!obj.is_object()) return LineError(source, line, "not a JSON object");
  TraceRequest r;
  r.line = line;
  int64_t timestamp = 0, input = 0, output = 0;
  if (!ReadCount(obj, "timestamp", &timestamp)) {
    return LineError(source, line, "\"timestamp\" must be a non-negative integer (ms)");
  }
  if (!ReadCount(obj, "input_length", &input) || input == 0 || input > UINT32_MAX) {
    return LineError(source, line, "\"input_length\" must be a positive integer");
  }
  if (!ReadCount(obj, "output_length", &output) || output > UINT32_MAX) {
    return LineError(source, line, "\"output_length\" must be a non-negative integer");
  }
  auto ids = obj.find("hash_ids");
  if (ids == obj.end() || !ids->is_array()) return LineError(source, line, "\"hash_ids\" must be an array");
  for (const auto& id : *ids) {
    if (!id.is_number_unsigned() && !(id.is_number_integer() && id.get<int64_t>() >= 0)) {
      return LineError(source, line, "\"hash_ids\" must hold non-negative integers");
    }
    r.hash_ids.push_back(id.get<uint64_t>());
  }
  r.timestamp_ms = timestamp;
  r.input_length = static_cast<uint32_t>(input);
  r.output_length = static_cast<uint32_t>(output);
  if (uint64_t{r.input_length} > uint64_t{config::kTraceBlockTokens} * r.hash_ids.size()) {
    return LineError(source, line,
                     "input_length " + std::to_string(r.input_length) + " needs more than the " +
                         std::to_string(r.hash_ids.size()) + " hash_ids given (512 tokens each)");
  }
  return r;
}

}  // namespace

Result<std::vector<TraceRequest>> ParseTrace(std::istream& in, const std::string& source) {
  std::vector<TraceRequest> requests;
  std::string text;
  uint32_t line = 0;
  while (std::getline(in, text)) {
    ++line;
    if (std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isspace(c); })) continue;
    KVF_ASSIGN_OR_RETURN(TraceRequest r, ParseLine(text, source, line));
    requests.push_back(std::move(r));
  }
  if (requests.empty()) return InvalidArgument(source + ": no requests");
  std::stable_sort(requests.begin(), requests.end(),
                   [](const TraceRequest& a, const TraceRequest& b) { return a.timestamp_ms < b.timestamp_ms; });
  return requests;
}

Result<std::vector<TraceRequest>> LoadTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot open trace " + path);
  return ParseTrace(in, path);
}

Status TraceScale::Validate() const {
  if (!(time_scale > 0) || !std::isfinite(time_scale)) return InvalidArgument("--time-scale must be > 0");
  if (length_scale == 0 || length_scale > config::kTraceBlockTokens || (length_scale & (length_scale - 1)) != 0) {
    return InvalidArgument("--length-scale must be a power of two from 1 to 512 (it divides the 512-token block)");
  }
  if (!(duration_s >= 0) || !std::isfinite(duration_s)) return InvalidArgument("--duration must be >= 0");
  if (!(warmup_s >= 0) || !std::isfinite(warmup_s)) return InvalidArgument("--warmup-s must be >= 0");
  if (duration_s > 0 && warmup_s >= duration_s) {
    return InvalidArgument("--warmup-s must be below --duration: nothing would be measured");
  }
  return Status::Ok();
}

std::vector<ScaledRequest> ScaleTrace(const std::vector<TraceRequest>& trace, const TraceScale& scale) {
  std::vector<ScaledRequest> out;
  if (trace.empty()) return out;
  const int64_t start_ms = trace.front().timestamp_ms;
  auto scaled = [&](uint32_t n) { return std::max<uint32_t>(1, (n + scale.length_scale - 1) / scale.length_scale); };
  for (const TraceRequest& r : trace) {
    ScaledRequest s;
    s.arrival_s = static_cast<double>(r.timestamp_ms - start_ms) / 1000.0 / scale.time_scale;
    if (scale.duration_s > 0 && s.arrival_s >= scale.duration_s) break;  // sorted by arrival
    s.input_length = scaled(r.input_length);
    s.output_length = scaled(r.output_length);
    s.source = &r;
    out.push_back(s);
  }
  return out;
}

}  // namespace kvfleet::bench
