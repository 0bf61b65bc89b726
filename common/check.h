// KVF_CHECK: invariants that must hold unless the program itself is wrong.
// A failed check prints the file, the line, the condition and an optional message,
// then aborts. Expected failures (bad input, I/O) return a Status instead.
#pragma once

#include <sstream>
#include <string>

namespace kvfleet::internal {
[[noreturn]] void CheckFailed(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace kvfleet::internal

// KVF_CHECK(cond) << "optional message " << value;
#define KVF_CHECK(cond)                                                                     \
  for (bool _kvf_ok = static_cast<bool>(cond); !_kvf_ok; _kvf_ok = true)                    \
  ::kvfleet::internal::CheckMessage(__FILE__, __LINE__, #cond).stream()

#define KVF_CHECK_EQ(a, b) KVF_CHECK((a) == (b)) << #a " = " << (a) << ", " #b " = " << (b) << " "
#define KVF_CHECK_LT(a, b) KVF_CHECK((a) < (b)) << #a " = " << (a) << ", " #b " = " << (b) << " "
#define KVF_CHECK_LE(a, b) KVF_CHECK((a) <= (b)) << #a " = " << (a) << ", " #b " = " << (b) << " "

#ifdef NDEBUG
#define KVF_DCHECK(cond) \
  while (false) KVF_CHECK(cond)
#else
#define KVF_DCHECK(cond) KVF_CHECK(cond)
#endif

namespace kvfleet::internal {
// Collects the streamed message and aborts in its destructor.
class CheckMessage {
 public:
  CheckMessage(const char* file, int line, const char* cond) : file_(file), line_(line), cond_(cond) {}
  [[noreturn]] ~CheckMessage() { CheckFailed(file_, line_, cond_, os_.str()); }
  std::ostream& stream() { return os_; }

 private:
  const char* file_;
  int line_;
  const char* cond_;
  std::ostringstream os_;
};
}  // namespace kvfleet::internal
