// Pda: runs an Automaton as a pushdown automaton over bytes, on sets of persistent stacks.
//
// A stack is its top state plus a parent: an interned frame (return state, parent) in a
// FramePool, or kBottom. Stacks share their frames, so a set of stacks is a small vector
// of (state, parent) pairs and copying one is cheap. A Position is such a set after
// closure: every top has byte edges, and can_end says whether some stack completed the
// bottom rule (for a matcher: the grammar can terminate here).
//
// Thread safety: thread-compatible. A Pda and its FramePool belong to one matcher (or one
// compile-time walk) at a time.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "grammar/automaton.h"

namespace kvfleet::grammar {

constexpr int32_t kBottom = -1;

struct Top {
  int32_t state;
  int32_t parent;  // a frame of the pool, or kBottom
  bool operator==(const Top&) const = default;
};

struct Position {
  std::vector<Top> tops;
  bool can_end = false;
  bool overflow = false;  // more stacks than the limit: treated as a dead end
  bool dead() const { return tops.empty() && !can_end; }
  void Clear() {
    tops.clear();
    can_end = false;
    overflow = false;
  }
};

class FramePool {
 public:
  struct Frame {
    int32_t state;  // the return state
    int32_t parent;
  };
  int32_t Intern(int32_t state, int32_t parent) {
    uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(state)) << 32) | static_cast<uint32_t>(parent);
    auto [it, inserted] = index_.try_emplace(key, static_cast<int32_t>(frames_.size()));
    if (inserted) frames_.push_back({state, parent});
    return it->second;
  }
  const Frame& frame(int32_t id) const { return frames_[id]; }
  size_t size() const { return frames_.size(); }

 private:
  std::vector<Frame> frames_;
  std::unordered_map<uint64_t, int32_t> index_;
};

class Pda {
 public:
  Pda(const Automaton* automaton, FramePool* pool, size_t max_stacks)
      : a_(automaton), pool_(pool), max_stacks_(max_stacks) {}

  // Adds the closure of stack (state, parent) to *out: its tops that read bytes, and
  // can_end when a stack completes the bottom rule.
  void Close(int32_t state, int32_t parent, Position* out);
  // *out = the closure of every stack of `in` after reading byte b. `in` is closed.
  void Step(const Position& in, uint8_t b, Position* out);
  // *out = `in` after the bytes; stops early when dead.
  void Run(const Position& in, std::string_view bytes, Position* out);

  const Automaton& automaton() const { return *a_; }

 private:
  void AddTop(Top t, Position* out);

  const Automaton* a_;
  FramePool* pool_;
  size_t max_stacks_;
  std::vector<Top> work_;  // scratch for Close
  std::vector<Top> seen_;  // stacks expanded by the current Close/Step
  Position scratch_;
};

}  // namespace kvfleet::grammar
