#include "schema/event_codec.h"

#include <cmath>
#include <utility>

#include <capnp/message.h>
#include <kj/exception.h>

#include "common/check.h"
#include "schema/events.capnp.h"
#include "schema/limits.h"
#include "schema/wire.h"

namespace kvfleet::events {

namespace {

schema::Tier ToWire(kv::Tier t) { return t == kv::Tier::kDevice ? schema::Tier::DEVICE : schema::Tier::HOST; }

Result<kv::Tier> FromWire(schema::Tier t) {
  switch (t) {
    case schema::Tier::DEVICE: return kv::Tier::kDevice;
    case schema::Tier::HOST: return kv::Tier::kHost;
  }
  return InvalidArgument("unknown tier " + std::to_string(static_cast<int>(t)));
}

Status CheckPriority(uint8_t p) {
  if (p > kv::kMaxPriority) return InvalidArgument("priority " + std::to_string(p) + " > 100");
  return Status::Ok();
}

// A publisher stamps a batch's events with consecutive ids; an older one leaves them all 0.
Status CheckEventIds(std::span<const kv::KvEvent> events) {
  if (events.empty()) return Status::Ok();
  const uint64_t first = events.front().id;
  for (size_t i = 1; i < events.size(); ++i) {
    const uint64_t want = first == 0 ? 0 : first + i;
    if (events[i].id != want) {
      return InvalidArgument("event ids " + std::to_string(first) + ", ..., " + std::to_string(events[i].id) +
                             " at position " + std::to_string(i) + " are neither all 0 nor consecutive");
    }
  }
  return Status::Ok();
}

struct BlockEventCounter {
  size_t operator()(const kv::StoredEvent& e) const { return e.blocks.size(); }
  size_t operator()(const kv::RemovedEvent& e) const { return e.hashes.size(); }
  size_t operator()(const kv::UpdatedEvent&) const { return 1; }
  size_t operator()(const kv::ClearedEvent&) const { return 1; }
  size_t operator()(const kv::CreatedEvent&) const { return 0; }
};

void BuildKvEvent(const kv::KvEvent& event, schema::KvEvent::Builder out) {
  out.setWindowSize(event.window_size);
  out.setEventId(event.id);
  std::visit(
      [&](const auto& e) {
        using T = std::decay_t<decltype(e)>;
        if constexpr (std::is_same_v<T, kv::StoredEvent>) {
          auto s = out.initStored();
          s.setParentHash(e.parent_hash);
          auto blocks = s.initBlocks(static_cast<unsigned>(e.blocks.size()));
          for (size_t i = 0; i < e.blocks.size(); ++i) {
            const kv::StoredBlock& b = e.blocks[i];
            auto wb = blocks[static_cast<unsigned>(i)];
            wb.setHash(b.hash);
            wb.setTier(ToWire(b.tier));
            wb.setPriority(b.priority);
            wb.setLoraId(b.lora_id);
            if (!b.tokens.empty()) {
              auto toks = wb.initTokens(static_cast<unsigned>(b.tokens.size()));
              for (size_t j = 0; j < b.tokens.size(); ++j) toks.set(static_cast<unsigned>(j), b.tokens[j]);
            }
          }
        } else if constexpr (std::is_same_v<T, kv::RemovedEvent>) {
          auto r = out.initRemoved();
          r.setTier(ToWire(e.tier));
          auto hashes = r.initHashes(static_cast<unsigned>(e.hashes.size()));
          for (size_t i = 0; i < e.hashes.size(); ++i) hashes.set(static_cast<unsigned>(i), e.hashes[i]);
        } else if constexpr (std::is_same_v<T, kv::UpdatedEvent>) {
          auto u = out.initUpdated();
          u.setHash(e.hash);
          u.setHasTier(e.tier.has_value());
          if (e.tier) u.setTier(ToWire(*e.tier));
          u.setHasPriority(e.priority.has_value());
          if (e.priority) u.setPriority(*e.priority);
        } else if constexpr (std::is_same_v<T, kv::ClearedEvent>) {
          out.setCleared();
        } else {
          auto c = out.initCreated();
          auto per_tier = c.initBlocksPerTier(kv::kNumTiers);
          for (int t = 0; t < kv::kNumTiers; ++t) per_tier.set(t, e.blocks_per_tier[t]);
          c.setBlockSize(e.block_size);
        }
      },
      event.data);
}

// Lists of structs may hold zero-sized elements, which cost the sender nothing each: a few
// bytes could expand into millions of default entries. A real element takes at least one
// word, so a message's size in words bounds how many list structs it can honestly carry.
struct StructBudget {
  uint64_t left;
  bool Take(uint64_t n) {
    if (n > left) return false;
    left -= n;
    return true;
  }
};

Status ParseKvEvent(schema::KvEvent::Reader in, kv::KvEvent* out, StructBudget& budget) {
  out->window_size = in.getWindowSize();
  out->id = in.getEventId();
  switch (in.which()) {
    case schema::KvEvent::STORED: {
      auto s = in.getStored();
      kv::StoredEvent e;
      e.parent_hash = s.getParentHash();
      auto blocks = s.getBlocks();
      if (!budget.Take(blocks.size())) return DataLoss("stored event with empty block entries");
      e.blocks.resize(blocks.size());
      for (unsigned i = 0; i < blocks.size(); ++i) {
        auto b = blocks[i];
        kv::StoredBlock& o = e.blocks[i];
        o.hash = b.getHash();
        KVF_ASSIGN_OR_RETURN(o.tier, FromWire(b.getTier()));
        o.priority = b.getPriority();
        KVF_RETURN_IF_ERROR(CheckPriority(o.priority));
        o.lora_id = b.getLoraId();
        auto toks = b.getTokens();
        if (toks.size() == 0) continue;
        if (toks.size() > config::kMaxTokensPerBlock) return InvalidArgument("stored block with too many tokens");
        o.tokens.resize(toks.size());
        for (unsigned j = 0; j < toks.size(); ++j) o.tokens[j] = toks[j];
      }
      out->data = std::move(e);
      return Status::Ok();
    }
    case schema::KvEvent::REMOVED: {
      auto r = in.getRemoved();
      kv::RemovedEvent e;
      KVF_ASSIGN_OR_RETURN(e.tier, FromWire(r.getTier()));
      auto hashes = r.getHashes();
      e.hashes.resize(hashes.size());
      for (unsigned j = 0; j < hashes.size(); ++j) e.hashes[j] = hashes[j];
      out->data = std::move(e);
      return Status::Ok();
    }
    case schema::KvEvent::UPDATED: {
      auto u = in.getUpdated();
      kv::UpdatedEvent e;
      e.hash = u.getHash();
      if (u.getHasTier()) {
        KVF_ASSIGN_OR_RETURN(auto tier, FromWire(u.getTier()));
        e.tier = tier;
      }
      if (u.getHasPriority()) {
        KVF_RETURN_IF_ERROR(CheckPriority(u.getPriority()));
        e.priority = u.getPriority();
      }
      out->data = e;
      return Status::Ok();
    }
    case schema::KvEvent::CLEARED:
      out->data = kv::ClearedEvent{};
      return Status::Ok();
    case schema::KvEvent::CREATED: {
      auto c = in.getCreated();
      kv::CreatedEvent e;
      auto per_tier = c.getBlocksPerTier();
      for (unsigned t = 0; t < per_tier.size() && t < kv::kNumTiers; ++t) e.blocks_per_tier[t] = per_tier[t];
      e.block_size = c.getBlockSize();
      out->data = e;
      return Status::Ok();
    }
  }
  return InvalidArgument("unknown event kind " + std::to_string(static_cast<int>(in.which())));
}

Status ParseKvEvents(capnp::List<schema::KvEvent>::Reader in, std::vector<kv::KvEvent>* out, StructBudget& budget) {
  if (!budget.Take(in.size())) return DataLoss("empty event entries");
  out->resize(in.size());
  for (unsigned i = 0; i < in.size(); ++i) KVF_RETURN_IF_ERROR(ParseKvEvent(in[i], &(*out)[i], budget));
  return Status::Ok();
}

void BuildLoad(const LoadReport& load, schema::Load::Builder out) {
  out.setActiveRequests(load.active_requests);
  out.setQueuedRequests(load.queued_requests);
  out.setActivePrefillTokens(load.active_prefill_tokens);
  out.setActiveDecodeBlocks(load.active_decode_blocks);
  auto free = out.initFreeBlocks(kv::kNumTiers);
  auto total = out.initTotalBlocks(kv::kNumTiers);
  for (int t = 0; t < kv::kNumTiers; ++t) {
    free.set(t, load.free_blocks[t]);
    total.set(t, load.total_blocks[t]);
  }
  out.setPrefillTokensPerSecond(load.prefill_tokens_per_second);
  out.setDecodeTokensPerSecond(load.decode_tokens_per_second);
  out.setPredictedWaitUs(load.predicted_wait_us);
  out.setPulledWaitUs(load.pulled_wait_us);
  auto loras = out.initResidentLoras(static_cast<unsigned>(load.resident_loras.size()));
  for (unsigned i = 0; i < load.resident_loras.size(); ++i) loras.set(i, load.resident_loras[i]);
  if (load.pulls.empty()) return;  // a null list: most batches carry none
  auto pulls = out.initPulls(static_cast<unsigned>(load.pulls.size()));
  for (unsigned i = 0; i < load.pulls.size(); ++i) {
    pulls[i].setSource(wire::AsText(load.pulls[i].source));
    pulls[i].setPulls(load.pulls[i].pulls);
    pulls[i].setBytes(load.pulls[i].bytes);
    pulls[i].setSeconds(load.pulls[i].seconds);
    pulls[i].setFailed(load.pulls[i].failed);
    pulls[i].setFailedSeconds(load.pulls[i].failed_seconds);
  }
}

Result<LoadReport> ParseLoad(schema::Load::Reader in) {
  LoadReport l;
  l.active_requests = in.getActiveRequests();
  l.queued_requests = in.getQueuedRequests();
  l.active_prefill_tokens = in.getActivePrefillTokens();
  l.active_decode_blocks = in.getActiveDecodeBlocks();
  auto free = in.getFreeBlocks();
  auto total = in.getTotalBlocks();
  for (unsigned t = 0; t < kv::kNumTiers; ++t) {
    if (t < free.size()) l.free_blocks[t] = free[t];
    if (t < total.size()) l.total_blocks[t] = total[t];
  }
  l.prefill_tokens_per_second = in.getPrefillTokensPerSecond();
  l.decode_tokens_per_second = in.getDecodeTokensPerSecond();
  l.predicted_wait_us = in.getPredictedWaitUs();
  l.pulled_wait_us = in.getPulledWaitUs();
  for (uint64_t id : in.getResidentLoras()) l.resident_loras.push_back(id);
  auto pulls = in.getPulls();
  if (pulls.size() > config::kMaxPullSources) {
    return InvalidArgument("load with pull totals from " + std::to_string(pulls.size()) + " holders (at most " +
                           std::to_string(config::kMaxPullSources) + ")");
  }
  for (auto p : pulls) {
    const capnp::Text::Reader source = p.getSource();
    if (source.size() == 0 || source.size() > static_cast<size_t>(wire::limits::kMaxNameBytes)) {
      return InvalidArgument("pull totals with a holder endpoint of " + std::to_string(source.size()) + " bytes");
    }
    if (!std::isfinite(p.getSeconds()) || p.getSeconds() < 0 || !std::isfinite(p.getFailedSeconds()) ||
        p.getFailedSeconds() < 0) {
      return InvalidArgument("pull totals with bad seconds");
    }
    l.pulls.push_back(PullTotals{wire::FromText(source), p.getPulls(), p.getBytes(), p.getSeconds(), p.getFailed(),
                                 p.getFailedSeconds()});
  }
  return l;
}

void BuildBatch(const BatchHeader& header, std::span<const kv::KvEvent> events, const LoadReport& load,
                schema::EventBatch::Builder b) {
  b.setWorkerId(wire::AsText(header.worker_id));
  b.setEpoch(header.epoch);
  b.setSeq(header.seq);
  b.setCreatedNs(header.created_ns);
  auto list = b.initEvents(static_cast<unsigned>(events.size()));
  for (size_t i = 0; i < events.size(); ++i) BuildKvEvent(events[i], list[static_cast<unsigned>(i)]);
  BuildLoad(load, b.initLoad());
}

Status CheckWorkerId(capnp::Text::Reader id) {
  if (id.size() == 0 || id.size() > config::kMaxWorkerIdBytes) return InvalidArgument("bad worker id length");
  return Status::Ok();
}

// REQUIRES: called inside a kj::Exception guard (a malformed pointer throws).
Result<DecodedBatch> ParseBatch(schema::EventBatch::Reader in, StructBudget& budget) {
  DecodedBatch out;
  auto id = in.getWorkerId();
  KVF_RETURN_IF_ERROR(CheckWorkerId(id));
  out.header.worker_id.assign(id.begin(), id.end());
  out.header.epoch = in.getEpoch();
  out.header.seq = in.getSeq();
  out.header.created_ns = in.getCreatedNs();
  if (out.header.epoch == 0) return InvalidArgument("epoch 0");
  if (out.header.seq == 0) return InvalidArgument("seq 0");
  KVF_RETURN_IF_ERROR(ParseKvEvents(in.getEvents(), &out.events, budget));
  KVF_RETURN_IF_ERROR(CheckEventIds(out.events));
  KVF_ASSIGN_OR_RETURN(out.load, ParseLoad(in.getLoad()));
  out.block_events = BlockEventCount(out.events);
  return out;
}

schema::ReplayReply::Builder InitReply(capnp::MessageBuilder& message, const ReplyHeader& header) {
  auto reply = message.initRoot<schema::ReplayReply>();
  reply.setWorkerId(wire::AsText(header.worker_id));
  reply.setEpoch(header.epoch);
  reply.setRequestId(header.request_id);
  reply.setLast(header.last);
  return reply;
}

// REQUIRES: called inside a kj::Exception guard.
Result<ReplayReply> ParseReply(schema::ReplayReply::Reader in, StructBudget& budget) {
  ReplayReply out;
  auto id = in.getWorkerId();
  KVF_RETURN_IF_ERROR(CheckWorkerId(id));
  out.header.worker_id.assign(id.begin(), id.end());
  out.header.epoch = in.getEpoch();
  out.header.request_id = in.getRequestId();
  out.header.last = in.getLast();
  if (out.header.epoch == 0) return InvalidArgument("epoch 0");
  switch (in.which()) {
    case schema::ReplayReply::BATCHES: {
      auto batches = in.getBatches();
      if (!budget.Take(batches.size())) return DataLoss("replay with empty batch entries");
      std::vector<DecodedBatch> list;
      list.reserve(batches.size());
      for (auto b : batches) {
        KVF_ASSIGN_OR_RETURN(DecodedBatch batch, ParseBatch(b, budget));
        list.push_back(std::move(batch));
      }
      out.body = std::move(list);
      return out;
    }
    case schema::ReplayReply::SNAPSHOT: {
      auto snap = in.getSnapshot();
      SnapshotChunk chunk;
      chunk.consistent_seq = snap.getConsistentSeq();
      chunk.consistent_event_id = snap.getConsistentEventId();
      KVF_RETURN_IF_ERROR(ParseKvEvents(snap.getEvents(), &chunk.events, budget));
      out.body = std::move(chunk);
      return out;
    }
    case schema::ReplayReply::ERROR: {
      auto text = in.getError();
      out.body = ReplayError{std::string(text.begin(), text.end())};
      return out;
    }
  }
  return InvalidArgument("unknown replay reply kind " + std::to_string(static_cast<int>(in.which())));
}

// Decodes a frame whose root is T with `parse` (root reader, budget) -> Result: one pass over
// the frame, the reader validating each pointer as it is followed (and throwing on a bad
// one) and the frame's size bounding its list structs, so the separate validating
// traversals (wire::Decode's and totalSize()) are not needed.
template <typename T, typename Parse>
auto DecodeFrame(const void* data, size_t size, const char* what, Parse&& parse)
    -> decltype(parse(std::declval<typename T::Reader>(), std::declval<StructBudget&>())) {
  KVF_ASSIGN_OR_RETURN(auto msg, wire::DecodeRaw(data, size));
  StructBudget budget{size / sizeof(capnp::word)};
  try {
    return parse(msg->template Root<T>(), budget);
  } catch (const kj::Exception& e) {
    return DataLoss(std::string("malformed ") + what + ": " + e.getDescription().cStr());
  }
}

}  // namespace

size_t BlockEventCount(std::span<const kv::KvEvent> events) {
  size_t n = 0;
  for (const kv::KvEvent& e : events) n += std::visit(BlockEventCounter{}, e.data);
  return n;
}

std::string EncodeBatch(const BatchHeader& header, std::span<const kv::KvEvent> events, const LoadReport& load) {
  capnp::MallocMessageBuilder message;
  BuildBatch(header, events, load, message.initRoot<schema::EventBatch>());
  return wire::Encode(message);
}

Result<DecodedBatch> DecodeBatch(const void* data, size_t size) {
  return DecodeFrame<schema::EventBatch>(data, size, "batch", ParseBatch);
}

std::string EncodeReplayRequest(const ReplayRequest& request) {
  capnp::MallocMessageBuilder message;
  auto r = message.initRoot<schema::ReplayRequest>();
  r.setEpoch(request.epoch);
  r.setFromSeq(request.from_seq);
  r.setRequestId(request.request_id);
  return wire::Encode(message);
}

Result<ReplayRequest> DecodeReplayRequest(const void* data, size_t size) {
  auto parse = [](schema::ReplayRequest::Reader in, StructBudget&) -> Result<ReplayRequest> {
    return ReplayRequest{in.getEpoch(), in.getFromSeq(), in.getRequestId()};
  };
  return DecodeFrame<schema::ReplayRequest>(data, size, "replay request", parse);
}

std::string EncodeReplayBatches(const ReplyHeader& header, std::span<const std::string_view> frames) {
  capnp::MallocMessageBuilder message;
  auto list = InitReply(message, header).initBatches(static_cast<unsigned>(frames.size()));
  for (size_t i = 0; i < frames.size(); ++i) {
    // Copied into word-aligned memory and embedded as it was published.
    auto frame = wire::DecodeRaw(frames[i].data(), frames[i].size());
    KVF_CHECK(frame.ok()) << "a replay frame that EncodeBatch did not make: " << frame.status().ToString();
    list.setWithCaveats(static_cast<unsigned>(i), (*frame)->Root<schema::EventBatch>());
  }
  return wire::Encode(message);
}

std::string EncodeSnapshotChunk(const ReplyHeader& header, uint64_t consistent_seq, uint64_t consistent_event_id,
                                std::span<const kv::KvEvent> events) {
  capnp::MallocMessageBuilder message;
  auto snap = InitReply(message, header).initSnapshot();
  snap.setConsistentSeq(consistent_seq);
  snap.setConsistentEventId(consistent_event_id);
  auto list = snap.initEvents(static_cast<unsigned>(events.size()));
  for (size_t i = 0; i < events.size(); ++i) BuildKvEvent(events[i], list[static_cast<unsigned>(i)]);
  return wire::Encode(message);
}

std::string EncodeReplayError(const ReplyHeader& header, std::string_view message_text) {
  capnp::MallocMessageBuilder message;
  InitReply(message, header).setError(capnp::Text::Reader(message_text.data(), message_text.size()));
  return wire::Encode(message);
}

Result<ReplayReply> DecodeReplayReply(const void* data, size_t size) {
  return DecodeFrame<schema::ReplayReply>(data, size, "replay reply", ParseReply);
}

}  // namespace kvfleet::events
