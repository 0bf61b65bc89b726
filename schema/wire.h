// Cap'n Proto framing for ZMQ: one message per frame, as a flat word array.
//
// Decode() copies the frame into word-aligned memory and walks the whole message once
// (totalSize), so a frame with bad framing or out-of-bounds pointers is an error here.
// A frame can still hold a field of the wrong type (a bit list where a struct list is
// due); Cap'n Proto throws kj::Exception when such a field is read. Code that reads an
// untrusted frame therefore reads it inside Guard(), which turns that into a Status.
//
// Thread safety: values; a DecodedMessage is owned by one thread.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/array.h>
#include <kj/exception.h>

#include "common/status.h"

namespace kvfleet::wire {

// Limits for untrusted input: 512 MiB of words, nesting 64 deep.
constexpr uint64_t kTraversalLimitWords = 64ull * 1024 * 1024;
constexpr int kNestingLimit = 64;

// Serializes a builder into the bytes of one frame.
std::string Encode(capnp::MessageBuilder& message);

// A std::string as Cap'n Proto Text, every byte of it. A Text setter given the std::string
// itself reads it through kj::StringPtr's c_str() constructor and stops at the first NUL: a
// cache salt "a\0b" from a client would reach the worker as "a", hashed into another namespace
// than the router's, and a regex pattern would be cut short.
inline capnp::Text::Reader AsText(const std::string& s) { return capnp::Text::Reader(s.data(), s.size()); }
// Text as a std::string, every byte of it (its size, not up to a NUL).
inline std::string FromText(capnp::Text::Reader text) { return std::string(text.begin(), text.size()); }

// Refuses (OutOfRange) a list of an untrusted frame longer than `max`, before anything reads its
// elements. A list of structs may claim elements of no size, which take no bytes of the frame:
// within the traversal limit a frame of 400 bytes claimed 31 million logit biases, 3 s of decode
// and a 250 MB vector (schema_wire_fuzzer).
template <typename List>
Status CheckCount(const List& list, uint64_t max, const char* what) {
  if (list.size() <= max) return Status::Ok();
  return OutOfRange(std::string(what) + ": " + std::to_string(list.size()) + " entries, more than " +
                    std::to_string(max));
}

class DecodedMessage {
 public:
  template <typename T>
  typename T::Reader Root() {
    return reader_->getRoot<T>();
  }

 private:
  friend Result<std::unique_ptr<DecodedMessage>> DecodeRaw(const void* data, size_t size, bool in_place);
  kj::Array<capnp::word> words_;
  std::unique_ptr<capnp::FlatArrayMessageReader> reader_;
};

// Parses the segment table. Prefer Decode<T>, which also validates the root. With `in_place`
// and word-aligned `data`, the message reads the caller's bytes instead of a copy: they must
// outlive it unchanged.
Result<std::unique_ptr<DecodedMessage>> DecodeRaw(const void* data, size_t size, bool in_place = false);

// Decodes and fully validates a frame whose root is T. DecodeInPlace skips the copy where it
// can (DecodeRaw's in_place): for large frames read once while their buffer lives (a pull's
// blocks, whose bytes are copied out anyway).
template <typename T>
Result<std::unique_ptr<DecodedMessage>> Decode(const void* data, size_t size, bool in_place = false) {
  auto msg = DecodeRaw(data, size, in_place);
  if (!msg.ok()) return msg.status();
  try {
    (void)(*msg)->template Root<T>().totalSize();
  } catch (const kj::Exception& e) {
    return DataLoss(std::string("malformed message: ") + e.getDescription().cStr());
  }
  return msg;
}
template <typename T>
Result<std::unique_ptr<DecodedMessage>> DecodeInPlace(const void* data, size_t size) {
  return Decode<T>(data, size, true);
}

// Runs `fn` (returning Status or Result<T>) and turns a kj::Exception thrown while
// reading an untrusted message into DataLoss.
template <typename F>
auto Guard(F&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const kj::Exception& e) {
    return DataLoss(std::string("malformed message: ") + e.getDescription().cStr());
  }
}

}  // namespace kvfleet::wire
