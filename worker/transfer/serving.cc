// The holder's blocks out (TransferService::ServeFrame): a run comes a frame's chunk at a
// time, read by the engine into buffers that go back to it once encoded; each chunk's blocks
// are checksummed, checked against the request, encoded into one frame and sent as the
// receiver's queue has room, then `done`. Runs on the I/O thread only.
//
// Invariants:
//   1. Every stream opened by a first chunk ends in exactly one Released{stream=true}: at its
//      `done` (expired false), when cut (expired true), or at once when stale.
//   2. Every chunk's bytes go back to the engine (spent_ready) exactly once: when its frame is
//      encoded, or when its stream is cut or was over before the chunk came.
//   3. A serve's frames carry blocks 0..sent-1 in order, each checked by CheckBlock; `done`
//      counts them.
#include <algorithm>

#include "common/log.h"
#include "schema/limits.h"
#include "worker/transfer/transfer_service_impl.h"

namespace kvfleet::transfer {

namespace {

// What a blocks frame may hold besides its blocks: the reply's header, lists' tags.
constexpr uint64_t kFrameBudget = wire::limits::kMaxTransferBytes - wire::limits::kSlackBytes;
// A frame's blocks: up to config::kFrameTargetBytes of them, or one larger block alone (up to
// the budget; CheckLayout keeps a block within it).
constexpr uint64_t kFrameTarget = std::min<uint64_t>(config::kFrameTargetBytes, kFrameBudget);

}  // namespace

uint32_t BlocksPerFrame(const Layout& layout) {
  const uint64_t n = kFrameTarget / EncodedBlockBytes(layout);
  return static_cast<uint32_t>(std::clamp<uint64_t>(n, 1, wire::limits::kMaxPullBlocks));
}

void TransferService::Impl::GiveBack(uint64_t peer_token, uint64_t transfer_id, std::vector<std::byte> bytes) {
  spent_ready.push_back(SpentFrame{peer_token, transfer_id, std::move(bytes)});
}

void TransferService::Impl::DoServeFrame(ServeFrameCommand& cmd) {
  auto it = std::find_if(serving.begin(), serving.end(), [&](const Serving& s) {
    return s.peer_token == cmd.peer_token && s.transfer_id == cmd.transfer_id;
  });
  if (it != serving.end() && !it->last_seen) {
    it->last_seen = cmd.chunk.last;
    it->chunks.push_back(std::move(cmd.chunk));
    return;
  }
  if (it == serving.end() && cmd.chunk.first == 0) {
    // A stream's first chunk opens it; past the deadline the receiver would drop the bytes.
    if (std::optional<OpenPull> open = TakeOpenPull(cmd.peer_token, cmd.transfer_id)) {
      Serving s;
      s.identity = identity_of_token.at(cmd.peer_token);
      s.peer_token = cmd.peer_token;
      s.transfer_id = cmd.transfer_id;
      s.request = std::move(open->request);
      s.deadline = open->deadline;
      s.last_seen = cmd.chunk.last;
      s.chunks.push_back(std::move(cmd.chunk));
      serving.push_back(std::move(s));
      return;
    }
  }
  // Stale at its first chunk (counted by TakeOpenPull), or a later chunk of a stream cut or
  // ended early since: the bytes go back, and a stale stream ends here.
  {
    std::lock_guard lock(mu);
    if (it == serving.end() && cmd.chunk.first == 0) releases_ready.push_back(Released{cmd.peer_token, cmd.transfer_id, true, false, true});
    GiveBack(cmd.peer_token, cmd.transfer_id, std::move(cmd.chunk.bytes));
  }
  Notify();
}

namespace {

// The blocks of `chunk` as views into its bytes, checksummed and checked as blocks sent..
// of `request`.
Status ViewChunk(const PullRequest& request, uint32_t sent, const FrameChunk& chunk, std::vector<BlockView>* views) {
  const size_t n = chunk.hashes.size();
  if (chunk.tokens.size() != n) return InvalidArgument("a chunk of " + std::to_string(n) + " hashes and other tokens");
  if (chunk.first != sent) {
    return InvalidArgument("a chunk from block " + std::to_string(chunk.first) + " where " + std::to_string(sent) +
                           " was due");
  }
  if (uint64_t{sent} + n > request.hashes.size()) {
    return InvalidArgument(std::to_string(sent + n) + " blocks for a chain of " + std::to_string(request.hashes.size()));
  }
  const Layout& layout = request.layout;
  const bool bytes = layout.dtype != KvDtype::kNone;
  uint64_t need = 0;
  if (bytes) {
    for (const PoolGeometry& p : layout.pools) need += n * p.bytes_per_block;
  }
  if (chunk.bytes.size() < need) {
    return InvalidArgument("a chunk of " + std::to_string(chunk.bytes.size()) + " bytes for " + std::to_string(need));
  }
  views->assign(n, BlockView{});
  for (size_t i = 0; i < n; ++i) {
    BlockView& v = (*views)[i];
    v.index = static_cast<uint32_t>(sent + i);
    v.hash = chunk.hashes[i];
    v.tokens = chunk.tokens[i];
  }
  size_t pool_at = 0;  // where this pool's n blocks start
  for (size_t p = 0; bytes && p < layout.pools.size(); ++p) {
    const uint64_t bpb = layout.pools[p].bytes_per_block;
    for (size_t i = 0; i < n; ++i) {
      const std::span<const std::byte> data(chunk.bytes.data() + pool_at + i * bpb, bpb);
      (*views)[i].data.push_back(data);
      (*views)[i].checksums.push_back(Checksum(data));
    }
    pool_at += n * bpb;
  }
  for (size_t i = 0; i < n; ++i) KVF_RETURN_IF_ERROR(CheckBlock(request, (*views)[i], static_cast<uint32_t>(sent + i), false));
  return Status::Ok();
}

}  // namespace

TransferService::Impl::Next TransferService::Impl::NextFrame(Serving& s) {
  while (!s.chunks.empty()) {
    FrameChunk chunk = std::move(s.chunks.front());
    s.chunks.pop_front();
    std::vector<BlockView> views;
    const Status status = ViewChunk(s.request, s.sent, chunk, &views);
    if (status.ok() && !views.empty()) {
      if (options.test_corrupt_served_data && !views[0].data.empty()) {
        // After the checksums: the first pool's first byte of each block.
        for (size_t i = 0; i < views.size(); ++i) {
          chunk.bytes[i * s.request.layout.pools[0].bytes_per_block] ^= std::byte{0x5a};
        }
      }
      s.pending = EncodeBlocks(s.transfer_id, views);
      s.sent += static_cast<uint32_t>(views.size());
    }
    {
      std::lock_guard lock(mu);
      GiveBack(s.peer_token, s.transfer_id, std::move(chunk.bytes));
    }
    Notify();
    if (!status.ok()) {
      Logger("transfer")->error("transfer {}: the engine streamed a frame that breaks Contract 4: {}", s.transfer_id,
                                status.message());
      if (s.sent == 0) {
        SendRefusal(s.identity, s.transfer_id, RefusalReason::kMalformed, "holder error: " + status.message());
        CutServing(s, "its first frame broke Contract 4");
        return Next::kCut;
      }
      // Blocks already sent stay a valid leading run: `done` ends the pull with them.
      {
        std::lock_guard lock(mu);
        for (FrameChunk& c : s.chunks) GiveBack(s.peer_token, s.transfer_id, std::move(c.bytes));
      }
      s.chunks.clear();
      s.last_seen = true;
      break;
    }
    if (!s.pending.empty()) return Next::kFrame;
    // An empty chunk (the engine's last, cut short): on to the next, or `done`.
  }
  if (!s.last_seen) return Next::kWaiting;
  if (s.done_queued) return Next::kFinished;
  s.pending = EncodeDone(s.transfer_id, s.sent);
  s.done_queued = true;
  return Next::kFrame;
}

void TransferService::Impl::CutServing(Serving& s, const char* why) {
  Logger("transfer")->info("transfer {}: the serve ended after {} blocks: {}", s.transfer_id, s.sent, why);
  {
    std::lock_guard lock(mu);
    stats.cut_serves++;
    for (FrameChunk& c : s.chunks) GiveBack(s.peer_token, s.transfer_id, std::move(c.bytes));
    releases_ready.push_back(Released{s.peer_token, s.transfer_id, true, false, true});
  }
  s.chunks.clear();
  Notify();
}

bool TransferService::Impl::PumpServing() {
  bool backlog = false;
  const TimeNs now = clock->Now();
  for (auto it = serving.begin(); it != serving.end();) {
    Serving& s = *it;
    if (s.deadline < now) {  // the receiver has given up: its clock started earlier than ours
      CutServing(s, "its deadline passed");
      it = serving.erase(it);
      continue;
    }
    Next next = Next::kFrame;
    bool gone = false;
    while (true) {
      if (s.pending.empty()) {
        next = NextFrame(s);
        if (next != Next::kFrame) break;
      }
      if (!SendTo(router, s.identity, s.pending, &gone)) {
        next = Next::kWaiting;
        break;
      }
      if (!s.done_queued) {
        std::lock_guard lock(mu);
        stats.served_frames++;
      }
      s.pending.clear();
    }
    if (gone) {
      CutServing(s, "the receiver left");
      it = serving.erase(it);
      continue;
    }
    if (next == Next::kCut) {
      it = serving.erase(it);
      continue;
    }
    if (next == Next::kWaiting) {
      backlog = backlog || !s.pending.empty();
      ++it;
      continue;
    }
    {
      std::lock_guard lock(mu);
      stats.served++;
      stats.served_blocks += s.sent;
      stats.served_bytes += uint64_t{s.sent} * s.request.layout.BytesPerBlock();
      releases_ready.push_back(Released{s.peer_token, s.transfer_id, false, false, true});
    }
    Notify();
    it = serving.erase(it);
  }
  return backlog;
}

void TransferService::Impl::CutAllServing() {
  for (Serving& s : serving) CutServing(s, "the service stopped");
  serving.clear();
}

}  // namespace kvfleet::transfer
