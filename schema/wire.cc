#include "schema/wire.h"

#include <cstring>

namespace kvfleet::wire {

std::string Encode(capnp::MessageBuilder& message) {
  kj::Array<capnp::word> words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

Result<std::unique_ptr<DecodedMessage>> DecodeRaw(const void* data, size_t size) {
  if (size == 0 || size % sizeof(capnp::word) != 0) {
    return DataLoss("malformed message: " + std::to_string(size) + " bytes is not a whole number of words");
  }
  auto msg = std::unique_ptr<DecodedMessage>(new DecodedMessage());
  msg->words_ = kj::heapArray<capnp::word>(size / sizeof(capnp::word));
  std::memcpy(msg->words_.begin(), data, size);
  capnp::ReaderOptions options;
  options.traversalLimitInWords = kTraversalLimitWords;
  options.nestingLimit = kNestingLimit;
  try {
    msg->reader_ = std::make_unique<capnp::FlatArrayMessageReader>(msg->words_.asPtr(), options);
  } catch (const kj::Exception& e) {
    return DataLoss(std::string("malformed message: ") + e.getDescription().cStr());
  }
  return msg;
}

}  // namespace kvfleet::wire

