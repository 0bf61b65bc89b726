#include "cli/simulate/sim_event_stream.h"

#include <algorithm>
#include <string_view>

#include "cli/simulate/sim_kv_cache.h"
#include "common/check.h"

namespace kvfleet::sim {

SimEventStream::SimEventStream(std::string worker_id, uint64_t epoch, size_t ring_batches)
    : worker_id_(std::move(worker_id)), topic_("kv." + worker_id_), epoch_(epoch), ring_batches_(ring_batches) {
  KVF_CHECK(epoch_ != 0 && ring_batches_ > 0);
}

const std::string& SimEventStream::Seal(std::vector<kv::KvEvent> events, const LoadReport& load, TimeNs wall_ns) {
  for (kv::KvEvent& e : events) e.id = ++event_id_;
  ++seq_;
  ring_.push_back(RingEntry{seq_, events::EncodeBatch({worker_id_, epoch_, seq_, wall_ns}, events, load)});
  while (ring_.size() > ring_batches_) ring_.pop_front();
  return ring_.back().frame;
}

events::ReplyHeader SimEventStream::Header(uint64_t request_id, bool last) const {
  return events::ReplyHeader{worker_id_, epoch_, request_id, last};
}

std::vector<std::string> SimEventStream::Answer(const void* data, size_t size, const SimKvCache& cache,
                                                bool* snapshot) const {
  *snapshot = false;
  auto request = events::DecodeReplayRequest(data, size);
  if (!request.ok()) return {events::EncodeReplayError(Header(0, true), request.status().ToString())};
  const uint64_t from = request->from_seq;
  const bool same_epoch = request->epoch == epoch_ && from >= 1;
  if (same_epoch && from == seq_ + 1) {
    return {events::EncodeReplayBatches(Header(request->request_id, true), {})};  // nothing missing
  }
  if (same_epoch && !ring_.empty() && from >= ring_.front().seq && from <= seq_) {
    return Replay(request->request_id, from);
  }
  *snapshot = true;
  return Snapshot(request->request_id, cache);
}

std::vector<std::string> SimEventStream::Replay(uint64_t request_id, uint64_t from) const {
  std::vector<std::string> out;
  auto it = std::lower_bound(ring_.begin(), ring_.end(), from,
                             [](const RingEntry& e, uint64_t s) { return e.seq < s; });
  std::vector<std::string_view> frames;
  while (it != ring_.end()) {
    const size_t n = std::min<size_t>(config::kReplayBatchesPerMessage, static_cast<size_t>(ring_.end() - it));
    frames.clear();
    for (size_t i = 0; i < n; ++i, ++it) frames.push_back(it->frame);
    out.push_back(events::EncodeReplayBatches(Header(request_id, it == ring_.end()), frames));
  }
  return out;
}

std::vector<std::string> SimEventStream::Snapshot(uint64_t request_id, const SimKvCache& cache) const {
  const std::vector<kv::KvEvent> all = cache.Snapshot();
  // Cut into messages of about kSnapshotBlocksPerMessage blocks, at event boundaries.
  std::vector<std::pair<size_t, size_t>> chunks;
  size_t begin = 0, blocks = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    blocks += events::BlockEventCount(std::span(&all[i], 1));
    if (blocks >= config::kSnapshotBlocksPerMessage) {
      chunks.emplace_back(begin, i + 1);
      begin = i + 1;
      blocks = 0;
    }
  }
  if (begin < all.size() || chunks.empty()) chunks.emplace_back(begin, all.size());
  std::vector<std::string> out;
  for (size_t c = 0; c < chunks.size(); ++c) {
    auto [b, e] = chunks[c];
    out.push_back(events::EncodeSnapshotChunk(Header(request_id, c + 1 == chunks.size()), seq_, event_id_,
                                              std::span(all).subspan(b, e - b)));
  }
  return out;
}

}  // namespace kvfleet::sim
