#include "schema/wire.h"

#include <cstdint>
#include <cstring>

#include <kj/io.h>

#include "common/check.h"

namespace kvfleet::wire {

std::string Encode(capnp::MessageBuilder& message) {
  // Written straight into the string: the bytes messageToFlatArray would make, one copy fewer
  // (snapshot chunks are megabytes).
  std::string out(capnp::computeSerializedSizeInWords(message) * sizeof(capnp::word), '\0');
  kj::ArrayOutputStream stream(kj::arrayPtr(reinterpret_cast<kj::byte*>(out.data()), out.size()));
  capnp::writeMessage(stream, message);
  KVF_CHECK(stream.getArray().size() == out.size()) << "capnp wrote " << stream.getArray().size() << " bytes, not "
                                                     << out.size();
  return out;
}

Result<std::unique_ptr<DecodedMessage>> DecodeRaw(const void* data, size_t size, bool in_place) {
  if (size == 0 || size % sizeof(capnp::word) != 0) {
    return DataLoss("malformed message: " + std::to_string(size) + " bytes is not a whole number of words");
  }
  auto msg = std::unique_ptr<DecodedMessage>(new DecodedMessage());
  kj::ArrayPtr<const capnp::word> words;
  if (in_place && reinterpret_cast<uintptr_t>(data) % alignof(capnp::word) == 0) {
    words = kj::arrayPtr(static_cast<const capnp::word*>(data), size / sizeof(capnp::word));
  } else {
    msg->words_ = kj::heapArray<capnp::word>(size / sizeof(capnp::word));
    std::memcpy(msg->words_.begin(), data, size);
    words = msg->words_.asPtr();
  }
  capnp::ReaderOptions options;
  options.traversalLimitInWords = kTraversalLimitWords;
  options.nestingLimit = kNestingLimit;
  try {
    msg->reader_ = std::make_unique<capnp::FlatArrayMessageReader>(words, options);
  } catch (const kj::Exception& e) {
    return DataLoss(std::string("malformed message: ") + e.getDescription().cStr());
  }
  return msg;
}

}  // namespace kvfleet::wire

