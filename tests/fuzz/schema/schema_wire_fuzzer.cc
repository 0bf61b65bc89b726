// Feeds arbitrary bytes to the decoders of the frames a worker or router reads from another
// process, beyond the KV events (events/) and Contract 4 (transfer/): a worker's Hello and Bye
// (the registration socket), the router's requests to a worker and the worker's answers
// (Contract 3, Describe included), and a router's gossip. Nothing may crash, hang or leak, and
// what decodes must cross the wire again unchanged: its encoding decodes to a message that
// encodes to the very same bytes. A decoder that drops or cuts what it read (a Text cut at a
// NUL byte, a field the encoder does not write) fails that.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <variant>
#include <vector>

#include "schema/describe.h"
#include "schema/gossip_codec.h"
#include "schema/registration.h"
#include "schema/requests.h"

namespace {

using namespace kvfleet;

// A frame as a received ZeroMQ frame is: word-aligned.
struct Frame {
  explicit Frame(const void* data, size_t size) : words((size + 7) / 8), size(size) {
    if (size > 0) std::memcpy(words.data(), data, size);
  }
  const void* data() const { return words.data(); }
  std::vector<uint64_t> words;
  size_t size;
};

// `encoded` is the encoding of what a frame decoded to: it must decode, and encode again to itself.
template <typename DecodeFn, typename EncodeFn>
void CheckStable(const std::string& encoded, DecodeFn decode, EncodeFn encode) {
  const Frame frame(encoded.data(), encoded.size());
  auto again = decode(frame.data(), frame.size);
  if (!again.ok()) __builtin_trap();  // the encoder wrote what the decoder refuses
  if (encode(*again) != encoded) __builtin_trap();  // a field lost or changed on the way
}

std::string EncodeToWorker(const ToWorkerMessage& m) {
  switch (m.kind) {
    case ToWorkerMessage::Kind::kGenerate: return EncodeGenerate(m.request_id, m.params);
    case ToWorkerMessage::Kind::kCancel: return EncodeCancel(m.request_id);
    case ToWorkerMessage::Kind::kLoadLora: return EncodeLoadLora(m.request_id, m.lora);
    case ToWorkerMessage::Kind::kUnloadLora: return EncodeUnloadLora(m.request_id, m.lora.name);
  }
  __builtin_trap();
}

std::string EncodeFromWorker(const FromWorkerMessage& m) {
  if (const auto* d = std::get_if<WorkerDelta>(&m)) return EncodeDelta(*d);
  if (const auto* e = std::get_if<WorkerError>(&m)) return EncodeError(*e);
  return EncodeLoraResult(std::get<WorkerLoraResult>(m));
}

std::string EncodeToRouter(const ToRouterMessage& m) {
  if (const auto* h = std::get_if<WorkerHello>(&m)) return EncodeHello(*h);
  return EncodeBye(std::get<WorkerBye>(m));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Frame frame(data, size);
  // A worker's request socket.
  (void)IsDescribe(frame.data(), size);
  if (auto m = DecodeToWorker(frame.data(), size); m.ok()) {
    CheckStable(EncodeToWorker(*m), DecodeToWorker, EncodeToWorker);
  }
  // A router's side of that socket.
  if (auto m = DecodeFromWorker(frame.data(), size); m.ok()) {
    CheckStable(EncodeFromWorker(*m), DecodeFromWorker, EncodeFromWorker);
  }
  if (auto h = DecodeDescribed(frame.data(), size); h.ok()) {
    CheckStable(EncodeDescribed(*h), DecodeDescribed, EncodeDescribed);
  }
  // A router's registration socket.
  if (auto m = DecodeToRouter(frame.data(), size); m.ok()) {
    CheckStable(EncodeToRouter(*m), DecodeToRouter, EncodeToRouter);
  }
  // A router's gossip socket.
  if (auto g = DecodeGossip(frame.data(), size); g.ok()) {
    CheckStable(EncodeGossip(*g), DecodeGossip, EncodeGossip);
  }
  return 0;
}
