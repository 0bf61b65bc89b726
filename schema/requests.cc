#include "schema/requests.h"

#include <capnp/message.h>

#include <algorithm>

#include "schema/limits.h"
#include "schema/wire.h"
#include "schema/worker.capnp.h"

namespace kvfleet {

namespace s = kvfleet::schema;

namespace {

FinishReason FromSchema(s::FinishReason r) {
  switch (r) {
    case s::FinishReason::NONE: return FinishReason::kNone;
    case s::FinishReason::STOP: return FinishReason::kStop;
    case s::FinishReason::LENGTH: return FinishReason::kLength;
    case s::FinishReason::CANCELLED: return FinishReason::kCancelled;
    case s::FinishReason::ERROR: return FinishReason::kError;
  }
  return FinishReason::kError;
}

s::FinishReason ToSchema(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return s::FinishReason::NONE;
    case FinishReason::kStop: return s::FinishReason::STOP;
    case FinishReason::kLength: return s::FinishReason::LENGTH;
    case FinishReason::kCancelled: return s::FinishReason::CANCELLED;
    case FinishReason::kError: return s::FinishReason::ERROR;
  }
  return s::FinishReason::ERROR;
}

void SetLogprobs(capnp::List<s::TokenLogprob>::Builder out, const std::vector<TokenLogprob>& in) {
  for (size_t i = 0; i < in.size(); ++i) {
    auto e = out[static_cast<unsigned>(i)];
    e.setToken(in[i].token);
    e.setLogprob(in[i].logprob);
    auto top = e.initTop(static_cast<unsigned>(in[i].top.size()));
    for (size_t k = 0; k < in[i].top.size(); ++k) {
      top[static_cast<unsigned>(k)].setToken(in[i].top[k].first);
      top[static_cast<unsigned>(k)].setLogprob(in[i].top[k].second);
    }
  }
}

Status GetLogprobs(capnp::List<s::TokenLogprob>::Reader in, std::vector<TokenLogprob>* out) {
  KVF_RETURN_IF_ERROR(wire::CheckCount(in, wire::limits::kMaxContextTokens, "logprobs"));
  out->reserve(in.size());
  for (auto e : in) {
    TokenLogprob t{e.getToken(), e.getLogprob(), {}};
    auto top = e.getTop();
    KVF_RETURN_IF_ERROR(wire::CheckCount(top, sampling::config::kMaxTopLogprobs, "top logprobs"));
    for (auto k : top) t.top.emplace_back(k.getToken(), k.getLogprob());
    out->push_back(std::move(t));
  }
  return Status::Ok();
}

void SetSampling(s::Sampling::Builder out, const SamplingParams& p) {
  out.setTemperature(p.temperature);
  out.setTopP(p.top_p);
  out.setTopK(p.top_k);
  if (p.seed) {
    out.setSeed(*p.seed);
    out.setHasSeed(true);
  }
  out.setMaxTokens(p.max_tokens);
  auto stops = out.initStopTokenIds(static_cast<unsigned>(p.stop_token_ids.size()));
  for (size_t i = 0; i < p.stop_token_ids.size(); ++i) stops.set(static_cast<unsigned>(i), p.stop_token_ids[i]);
  out.setIgnoreEos(p.ignore_eos);
  out.setN(p.n);
  out.setPresencePenalty(p.presence_penalty);
  out.setFrequencyPenalty(p.frequency_penalty);
  out.setRepetitionPenalty(p.repetition_penalty);
  out.setMinP(p.min_p);
  auto bias = out.initLogitBias(static_cast<unsigned>(p.logit_bias.size()));
  for (size_t i = 0; i < p.logit_bias.size(); ++i) {
    bias[static_cast<unsigned>(i)].setToken(p.logit_bias[i].first);
    bias[static_cast<unsigned>(i)].setBias(p.logit_bias[i].second);
  }
  // Int8 on the wire: a value out of range stays out of range (ValidateSampling refuses it).
  out.setLogprobs(static_cast<int8_t>(std::clamp(p.logprobs, -1, 127)));
  out.setPromptLogprobs(p.prompt_logprobs);
  if (p.structured.kind != StructuredOutput::Kind::kNone) {
    auto st = out.initStructured();
    st.setKind(static_cast<s::StructuredOutput::Kind>(p.structured.kind));
    st.setSpec(wire::AsText(p.structured.spec));
  }
}

// Over a limit ValidateSampling also refuses: OutOfRange here, before the list is read.
Result<SamplingParams> GetSampling(s::Sampling::Reader in) {
  SamplingParams p;
  p.temperature = in.getTemperature();
  p.top_p = in.getTopP();
  p.top_k = in.getTopK();
  if (in.getHasSeed()) p.seed = in.getSeed();
  p.max_tokens = in.getMaxTokens();
  auto stops = in.getStopTokenIds();
  KVF_RETURN_IF_ERROR(wire::CheckCount(stops, sampling::config::kMaxStopTokenIds, "stop token ids"));
  for (auto t : stops) p.stop_token_ids.push_back(t);
  p.ignore_eos = in.getIgnoreEos();
  p.n = in.getN();
  p.presence_penalty = in.getPresencePenalty();
  p.frequency_penalty = in.getFrequencyPenalty();
  p.repetition_penalty = in.getRepetitionPenalty();
  p.min_p = in.getMinP();
  auto bias = in.getLogitBias();
  KVF_RETURN_IF_ERROR(wire::CheckCount(bias, sampling::config::kMaxLogitBias, "logit bias"));
  for (auto b : bias) p.logit_bias.emplace_back(b.getToken(), b.getBias());
  p.logprobs = in.getLogprobs();
  p.prompt_logprobs = in.getPromptLogprobs();
  if (in.hasStructured()) {
    // A kind this build does not know reads past kEbnf, which ValidateSampling refuses.
    p.structured.kind = static_cast<StructuredOutput::Kind>(std::min<uint16_t>(
        static_cast<uint16_t>(in.getStructured().getKind()), static_cast<uint16_t>(StructuredOutput::Kind::kEbnf) + 1));
    p.structured.spec = wire::FromText(in.getStructured().getSpec());
  }
  return p;
}

}  // namespace

std::string EncodeGenerate(uint64_t request_id, const GenerateParams& p) {
  capnp::MallocMessageBuilder message;
  auto g = message.initRoot<s::ToWorker>().initGenerate();
  g.setRequestId(request_id);
  auto tokens = g.initTokens(static_cast<unsigned>(p.tokens.size()));
  for (size_t i = 0; i < p.tokens.size(); ++i) tokens.set(static_cast<unsigned>(i), p.tokens[i]);
  SetSampling(g.initSampling(), p.sampling);
  auto r = g.initRetention();
  auto ranges = r.initRanges(static_cast<unsigned>(p.retention.ranges.size()));
  for (size_t i = 0; i < p.retention.ranges.size(); ++i) {
    const auto& src = p.retention.ranges[i];
    auto dst = ranges[static_cast<unsigned>(i)];
    dst.setStart(src.start);
    if (src.end) {
      dst.setEnd(*src.end);
      dst.setHasEnd(true);
    }
    dst.setPriority(src.priority);
    if (src.duration_ms) {
      dst.setDurationMs(*src.duration_ms);
      dst.setHasDuration(true);
    }
  }
  if (p.retention.decode_priority) {
    r.setDecodePriority(*p.retention.decode_priority);
    r.setHasDecodePriority(true);
  }
  if (p.retention.decode_duration_ms) {
    r.setDecodeDurationMs(*p.retention.decode_duration_ms);
    r.setHasDecodeDuration(true);
  }
  g.setLoraName(wire::AsText(p.lora));
  g.setCacheSalt(wire::AsText(p.cache_salt));
  g.setModel(wire::AsText(p.model));
  if (!p.pull.source.empty()) {
    auto h = g.initPull();
    h.setSource(wire::AsText(p.pull.source));
    h.setServerKey(wire::AsText(p.pull.server_key));
    h.setBlocks(p.pull.blocks);
    h.setWorkerId(wire::AsText(p.pull.worker_id));
    h.setDeadlineMs(p.pull.deadline_ms);
  }
  return wire::Encode(message);
}

std::string EncodeCancel(uint64_t request_id) {
  capnp::MallocMessageBuilder message;
  message.initRoot<s::ToWorker>().initCancel().setRequestId(request_id);
  return wire::Encode(message);
}

std::string EncodeLoadLora(uint64_t request_id, const LoraControl& lora) {
  capnp::MallocMessageBuilder message;
  auto out = message.initRoot<s::ToWorker>().initLoadLora();
  out.setRequestId(request_id);
  out.setName(wire::AsText(lora.name));
  out.setPath(wire::AsText(lora.path));
  return wire::Encode(message);
}

std::string EncodeUnloadLora(uint64_t request_id, const std::string& name) {
  capnp::MallocMessageBuilder message;
  auto out = message.initRoot<s::ToWorker>().initUnloadLora();
  out.setRequestId(request_id);
  out.setName(wire::AsText(name));
  return wire::Encode(message);
}

Result<FromWorkerMessage> DecodeFromWorker(const void* data, size_t size) {
  auto decoded = wire::Decode<s::FromWorker>(data, size);
  if (!decoded.ok()) return decoded.status();
  return wire::Guard([&]() -> Result<FromWorkerMessage> {
    auto root = (*decoded)->Root<s::FromWorker>();
    if (root.isDelta()) {
      auto d = root.getDelta();
      WorkerDelta out;
      out.request_id = d.getRequestId();
      out.index = d.getIndex();
      auto tokens = d.getTokens();
      KVF_RETURN_IF_ERROR(wire::CheckCount(tokens, wire::limits::kMaxContextTokens, "delta tokens"));
      out.tokens.reserve(tokens.size());
      for (auto t : tokens) out.tokens.push_back(t);
      out.finish = FromSchema(d.getFinishReason());
      auto u = d.getUsage();
      out.usage = {u.getPromptTokens(), u.getCachedDeviceTokens(), u.getCachedHostTokens(), u.getCompletionTokens(),
                   u.getTimeToFirstTokenUs()};
      KVF_RETURN_IF_ERROR(GetLogprobs(d.getLogprobs(), &out.logprobs));
      KVF_RETURN_IF_ERROR(GetLogprobs(d.getPromptLogprobs(), &out.prompt_logprobs));
      return FromWorkerMessage(std::move(out));
    }
    if (root.isError()) {
      auto e = root.getError();
      WorkerError out;
      out.request_id = e.getRequestId();
      out.code = static_cast<WorkerErrorCode>(static_cast<int>(e.getCode()));
      if (static_cast<int>(e.getCode()) > static_cast<int>(WorkerErrorCode::kUnknownModel)) {
        out.code = WorkerErrorCode::kInternal;
      }
      out.message = wire::FromText(e.getMessage());
      return FromWorkerMessage(std::move(out));
    }
    if (root.isLoraResult()) {
      auto r = root.getLoraResult();
      WorkerLoraResult out;
      out.request_id = r.getRequestId();
      out.ok = r.getOk();
      out.code = static_cast<WorkerErrorCode>(static_cast<int>(r.getCode()));
      if (static_cast<int>(r.getCode()) > static_cast<int>(WorkerErrorCode::kUnknownModel)) {
        out.code = WorkerErrorCode::kInternal;
      }
      out.message = wire::FromText(r.getMessage());
      return FromWorkerMessage(std::move(out));
    }
    return DataLoss("FromWorker of an unknown kind");
  });
}

Result<ToWorkerMessage> DecodeToWorker(const void* data, size_t size) {
  auto decoded = wire::Decode<s::ToWorker>(data, size);
  if (!decoded.ok()) return decoded.status();
  return wire::Guard([&]() -> Result<ToWorkerMessage> {
    auto root = (*decoded)->Root<s::ToWorker>();
    ToWorkerMessage out;
    if (root.isCancel()) {
      out.kind = ToWorkerMessage::Kind::kCancel;
      out.request_id = root.getCancel().getRequestId();
      return out;
    }
    if (root.isLoadLora()) {
      auto l = root.getLoadLora();
      out.kind = ToWorkerMessage::Kind::kLoadLora;
      out.request_id = l.getRequestId();
      out.lora.name = wire::FromText(l.getName());
      out.lora.path = wire::FromText(l.getPath());
      return out;
    }
    if (root.isUnloadLora()) {
      auto l = root.getUnloadLora();
      out.kind = ToWorkerMessage::Kind::kUnloadLora;
      out.request_id = l.getRequestId();
      out.lora.name = wire::FromText(l.getName());
      return out;
    }
    if (!root.isGenerate()) return DataLoss("ToWorker of an unknown kind");
    auto g = root.getGenerate();
    out.request_id = g.getRequestId();
    auto tokens = g.getTokens();
    KVF_RETURN_IF_ERROR(wire::CheckCount(tokens, wire::limits::kMaxContextTokens, "prompt tokens"));
    out.params.tokens.reserve(tokens.size());
    for (auto t : tokens) out.params.tokens.push_back(t);
    KVF_ASSIGN_OR_RETURN(out.params.sampling, GetSampling(g.getSampling()));
    auto retention = g.getRetention();
    auto ranges = retention.getRanges();
    KVF_RETURN_IF_ERROR(wire::CheckCount(ranges, kMaxRetentionRanges, "retention ranges"));
    for (auto r : ranges) {
      RetentionRange rr;
      rr.start = r.getStart();
      if (r.getHasEnd()) rr.end = r.getEnd();
      rr.priority = r.getPriority();
      if (r.getHasDuration()) rr.duration_ms = r.getDurationMs();
      out.params.retention.ranges.push_back(rr);
    }
    if (retention.getHasDecodePriority()) out.params.retention.decode_priority = retention.getDecodePriority();
    if (retention.getHasDecodeDuration()) out.params.retention.decode_duration_ms = retention.getDecodeDurationMs();
    out.params.lora = wire::FromText(g.getLoraName());
    out.params.cache_salt = wire::FromText(g.getCacheSalt());
    out.params.model = wire::FromText(g.getModel());
    if (g.hasPull()) {
      auto h = g.getPull();
      out.params.pull.source = wire::FromText(h.getSource());
      out.params.pull.server_key = wire::FromText(h.getServerKey());
      out.params.pull.blocks = h.getBlocks();
      out.params.pull.worker_id = wire::FromText(h.getWorkerId());
      out.params.pull.deadline_ms = h.getDeadlineMs();
    }
    return out;
  });
}

uint64_t ReadGenerateRequestId(const void* data, size_t size) {
  auto decoded = wire::Decode<s::ToWorker>(data, size);
  if (!decoded.ok()) return 0;
  auto id = wire::Guard([&]() -> Result<uint64_t> {
    auto root = (*decoded)->Root<s::ToWorker>();
    return root.isGenerate() ? root.getGenerate().getRequestId() : 0;
  });
  return id.ok() ? *id : 0;
}

std::string EncodeDelta(const WorkerDelta& d) {
  capnp::MallocMessageBuilder message;
  auto out = message.initRoot<s::FromWorker>().initDelta();
  out.setRequestId(d.request_id);
  out.setIndex(d.index);
  auto tokens = out.initTokens(static_cast<unsigned>(d.tokens.size()));
  for (size_t i = 0; i < d.tokens.size(); ++i) tokens.set(static_cast<unsigned>(i), d.tokens[i]);
  out.setFinishReason(ToSchema(d.finish));
  auto u = out.initUsage();
  u.setPromptTokens(d.usage.prompt_tokens);
  u.setCachedDeviceTokens(d.usage.cached_device_tokens);
  u.setCachedHostTokens(d.usage.cached_host_tokens);
  u.setCompletionTokens(d.usage.completion_tokens);
  u.setTimeToFirstTokenUs(d.usage.time_to_first_token_us);
  if (!d.logprobs.empty()) SetLogprobs(out.initLogprobs(static_cast<unsigned>(d.logprobs.size())), d.logprobs);
  if (!d.prompt_logprobs.empty()) {
    SetLogprobs(out.initPromptLogprobs(static_cast<unsigned>(d.prompt_logprobs.size())), d.prompt_logprobs);
  }
  return wire::Encode(message);
}

std::string EncodeError(const WorkerError& e) {
  capnp::MallocMessageBuilder message;
  auto out = message.initRoot<s::FromWorker>().initError();
  out.setRequestId(e.request_id);
  out.setCode(static_cast<s::ErrorCode>(static_cast<int>(e.code)));
  out.setMessage(wire::AsText(e.message));
  return wire::Encode(message);
}

std::string EncodeLoraResult(const WorkerLoraResult& r) {
  capnp::MallocMessageBuilder message;
  auto out = message.initRoot<s::FromWorker>().initLoraResult();
  out.setRequestId(r.request_id);
  out.setOk(r.ok);
  out.setCode(static_cast<s::ErrorCode>(static_cast<int>(r.code)));
  out.setMessage(wire::AsText(r.message));
  return wire::Encode(message);
}

}  // namespace kvfleet
