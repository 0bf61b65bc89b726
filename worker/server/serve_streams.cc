#include "worker/server/serve_streams.h"

#include <algorithm>
#include <string>
#include <utility>

#include "common/check.h"
#include "common/log.h"

namespace kvfleet::server {

ServeStreams::ServeStreams(transfer::TransferService* service, kv::KvCacheManager* kv, backend::ModelBackend* backend,
                           transfer::Layout layout)
    : service_(service),
      kv_(kv),
      backend_(backend),
      layout_(std::move(layout)),
      bytes_(layout_.dtype != transfer::KvDtype::kNone),
      frame_blocks_(transfer::BlocksPerFrame(layout_)) {}

bool ServeStreams::Start(const transfer::IncomingPull& pull) {
  const transfer::PullRequest& r = pull.request;
  std::vector<kv::ExportedBlock> blocks = kv_->PinChain(r.parent_hash, r.hashes);
  if (blocks.empty()) return false;
  Run& run = runs_[{pull.peer_token, r.transfer_id}];
  KVF_CHECK(run.blocks.empty()) << "pull " << r.transfer_id << " is already being served";
  run.blocks = std::move(blocks);
  return true;
}

void ServeStreams::Ended(const transfer::Released& r) {
  if (!r.stream) return;
  auto it = runs_.find({r.peer_token, r.transfer_id});
  if (it == runs_.end()) return;
  kv_->UnpinChain(it->second.blocks);
  ++(r.expired ? stats_.cut : stats_.completed);
  runs_.erase(it);
}

bool ServeStreams::HasRoom(const Run& run) const {
  return run.next < run.blocks.size() && run.ahead < transfer::config::kFramesAhead;
}

bool ServeStreams::ready() const {
  return std::any_of(runs_.begin(), runs_.end(), [&](const auto& kv) { return HasRoom(kv.second); });
}

size_t ServeStreams::pinned_blocks() const {
  size_t n = 0;
  for (const auto& [key, run] : runs_) n += run.blocks.size();
  return n;
}

void ServeStreams::Pump() {
  for (transfer::SpentFrame& f : service_->TakeSpentFrames()) {
    auto it = runs_.find({f.peer_token, f.transfer_id});
    if (it != runs_.end() && it->second.ahead > 0) --it->second.ahead;
    if (spare_.size() < config::kSpareFrames && !f.bytes.empty()) spare_.push_back(std::move(f.bytes));
  }
  for (auto it = runs_.begin(); it != runs_.end();) {
    if (!HasRoom(it->second) || ReadFrame(it->first, it->second)) {
      ++it;
    } else {
      it = runs_.erase(it);
    }
  }
}

std::vector<std::byte> ServeStreams::TakeBuffer() {
  if (spare_.empty()) return {};
  std::vector<std::byte> b = std::move(spare_.back());
  spare_.pop_back();
  return b;
}

bool ServeStreams::ReadFrame(const Key& key, Run& run) {
  const size_t n = std::min<size_t>(frame_blocks_, run.blocks.size() - run.next);
  transfer::FrameChunk chunk;
  chunk.first = static_cast<uint32_t>(run.next);
  chunk.hashes.reserve(n);
  chunk.tokens.reserve(n);
  for (size_t i = run.next; i < run.next + n; ++i) {
    chunk.hashes.push_back(run.blocks[i].hash);
    chunk.tokens.push_back(run.blocks[i].tokens);
  }
  Status read = Status::Ok();
  if (bytes_) {
    chunk.bytes = TakeBuffer();
    // A buffer grows to the largest frame it has held and stays there: no page is mapped twice.
    const size_t need = n * layout_.BytesPerBlock();
    if (chunk.bytes.size() < need) chunk.bytes.resize(need);
    size_t at = 0;
    for (size_t p = 0; p < layout_.pools.size() && read.ok(); ++p) {
      const size_t bytes = n * layout_.pools[p].bytes_per_block;
      where_.clear();
      for (size_t i = run.next; i < run.next + n; ++i) where_.push_back(run.blocks[i].pools[p]);
      read = backend_->ReadKvBlocks(static_cast<uint32_t>(p), where_, std::span(chunk.bytes.data() + at, bytes));
      ++stats_.read_calls;
      at += bytes;
    }
  }
  if (!read.ok()) {
    ++stats_.read_failures;
    Logger("transfer")->error("pull {}: reading blocks {}..{} failed: {}", key.second, run.next, run.next + n - 1,
                              read.ToString());
    if (spare_.size() < config::kSpareFrames) spare_.push_back(std::move(chunk.bytes));
    if (run.next == 0) {  // nothing handed over: the pull is refused and the run let go now
      service_->Refuse(key.first, key.second, transfer::RefusalReason::kNotHeld,
                       "reading the blocks failed: " + read.message());
      kv_->UnpinChain(run.blocks);
      ++stats_.cut;
      return false;
    }
    // The blocks handed over are a valid leading run: `done` ends the pull with them.
    chunk = transfer::FrameChunk{};
    chunk.first = static_cast<uint32_t>(run.next);
    chunk.last = true;
    run.next = run.blocks.size();
    ++run.ahead;
    service_->ServeFrame(key.first, key.second, std::move(chunk));
    return true;
  }
  run.next += n;
  chunk.last = run.next == run.blocks.size();
  ++run.ahead;
  ++stats_.frames;
  stats_.blocks += n;
  service_->ServeFrame(key.first, key.second, std::move(chunk));
  return true;
}

Status ServeStreams::CheckInvariants() const {
  for (const auto& [key, run] : runs_) {
    if (run.blocks.empty()) return Internal("invariant 1: a stream with nothing pinned");
    if (run.ahead > transfer::config::kFramesAhead) return Internal("invariant 2: too many frames ahead");
    if (run.next > run.blocks.size()) return Internal("invariant 2: read past the run");
  }
  if (spare_.size() > config::kSpareFrames) return Internal("invariant 3: too many spare buffers");
  return Status::Ok();
}

}  // namespace kvfleet::server
