// Status and Result<T>: how kvfleet reports expected failures.
//
// A Status is OK or carries a code and a message. Result<T> holds either a T or a
// non-OK Status. Functions that can fail on bad input, I/O or the network return one
// of these; programming errors use KVF_CHECK (common/check.h) instead.
//
// Thread safety: values; no shared state.
#pragma once

#include <cassert>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace kvfleet {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,   // the caller's input is malformed or out of range
  kNotFound,          // a named thing does not exist
  kAlreadyExists,
  kOutOfRange,        // e.g. a prompt longer than the context
  kResourceExhausted, // no memory, no free blocks, queue full
  kFailedPrecondition,
  kUnavailable,       // a peer is unreachable or not ready
  kDeadlineExceeded,
  kCancelled,
  kDataLoss,          // corrupt or truncated data
  kUnimplemented,     // a feature we do not support, named in the message
  kInternal,
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "InvalidArgument: message", or "OK".
  std::string ToString() const;

  // Returns a copy whose message is prefixed with `context + ": "`.
  Status WithContext(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status OutOfRange(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// A number for a message, as a person writes it: 2.5, 1048576, 1e+15 (std::to_string
// prints 2.500000 and 1048576.000000). The shortest text that reads back as v: a float's
// 0.7 is "0.7", not the double 0.699999988079071.
std::string NumberText(double v);
std::string NumberText(float v);

// Result<T>: a T, or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    assert(!std::get<Status>(v_).ok() && "Result built from an OK Status has no value");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  // OK when a value is present.
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }

  // REQUIRES: ok().
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace kvfleet

// Returns the Status from the enclosing function when `expr` is not OK.
#define KVF_RETURN_IF_ERROR(expr)                  \
  do {                                             \
    ::kvfleet::Status _kvf_st = (expr);            \
    if (!_kvf_st.ok()) return _kvf_st;             \
  } while (0)

#define KVF_CONCAT_INNER(a, b) a##b
#define KVF_CONCAT(a, b) KVF_CONCAT_INNER(a, b)
// KVF_ASSIGN_OR_RETURN(auto x, MakeX()); returns the Status when MakeX() fails.
#define KVF_ASSIGN_OR_RETURN(lhs, expr) KVF_ASSIGN_OR_RETURN_IMPL(KVF_CONCAT(_kvf_r_, __LINE__), lhs, expr)
#define KVF_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
