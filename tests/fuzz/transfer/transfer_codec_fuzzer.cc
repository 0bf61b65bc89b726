// Feeds arbitrary bytes to everything a worker's transfer service does with a frame from another
// worker (Contract 4, schema/README.md): as a holder, DecodePullRequest and ReadTransferId; as a
// receiver, both PullReply decoders (the whole frame copied, and a `blocks` frame read in place)
// and the checks a reply passes against the request it answers. Nothing may crash, hang or leak,
// and beyond that:
//   - a request that decodes re-encodes to a frame that decodes to the same request;
//   - the two reply decoders agree: both accept or both refuse, and a `blocks` frame's views
//     hold the very blocks the copying decoder returns;
//   - a block passes CheckBlock only as the block its request's chain has at its index.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <variant>
#include <vector>

#include "schema/transfer_codec.h"
#include "tests/schema/transfer_example.h"

namespace {

using namespace kvfleet;
using namespace kvfleet::transfer;

void CheckBlocks(const PullRequest& request, const std::vector<Block>& blocks) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    const Block& b = blocks[i];
    for (uint32_t index : {static_cast<uint32_t>(i), b.index}) {
      const Status s = CheckBlock(request, b, index, /*verify_checksums=*/true);
      if (s.ok() && (b.index != index || index >= request.hashes.size() || b.hash != request.hashes[index] ||
                     b.tokens.size() != request.block_size)) {
        __builtin_trap();  // a block accepted as one the chain does not have there
      }
    }
  }
}

void CheckReply(const PullRequest& request, const PullReply& reply) {
  if (const auto* blocks = std::get_if<std::vector<Block>>(&reply.body)) CheckBlocks(request, *blocks);
  if (const auto* run = std::get_if<DeviceRun>(&reply.body)) (void)CheckDeviceRun(request, *run);
  if (const auto* run = std::get_if<NcclRun>(&reply.body)) (void)CheckNcclRun(request, *run);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const PullRequest known = testing::ExampleRequest();  // the spec vectors' request
  // Word-aligned, as a received ZeroMQ frame is: the in-place decoder reads it where it is.
  std::vector<uint64_t> words((size + 7) / 8);
  if (size > 0) std::memcpy(words.data(), data, size);
  const void* frame = words.data();

  // Holder side.
  (void)ReadTransferId(frame, size);
  Result<PullRequest> request = DecodePullRequest(frame, size);
  if (request.ok() && !request->release) {
    const std::string again = EncodePullRequest(*request);
    std::vector<uint64_t> aligned((again.size() + 7) / 8);
    std::memcpy(aligned.data(), again.data(), again.size());
    Result<PullRequest> redecoded = DecodePullRequest(aligned.data(), again.size());
    if (!redecoded.ok() || !(*redecoded == *request)) __builtin_trap();
  }

  // Receiver side.
  Result<PullReply> reply = DecodePullReply(frame, size);
  BlockFrame views;
  Result<PullReply> in_place = DecodePullReply(frame, size, &views);
  if (reply.ok() != in_place.ok()) __builtin_trap();
  if (!reply.ok()) return 0;
  if (reply->transfer_id != in_place->transfer_id || reply->body.index() != in_place->body.index()) __builtin_trap();
  if (const auto* blocks = std::get_if<std::vector<Block>>(&reply->body)) {
    if (views.blocks.size() != blocks->size()) __builtin_trap();
    for (size_t i = 0; i < blocks->size(); ++i) {
      if (!(ToBlock(views.blocks[i]) == (*blocks)[i])) __builtin_trap();
      const Status by_view = CheckBlock(known, views.blocks[i], static_cast<uint32_t>(i), true);
      const Status by_copy = CheckBlock(known, (*blocks)[i], static_cast<uint32_t>(i), true);
      if (by_view.ok() != by_copy.ok() || by_view.code() != by_copy.code()) __builtin_trap();
    }
  }
  CheckReply(known, *reply);
  if (request.ok()) CheckReply(*request, *reply);
  return 0;
}
