#include <algorithm>

#include "common/check.h"
#include "grammar/compiled.h"
#include "grammar/pda.h"
#include "grammar/token_walk.h"

namespace kvfleet::grammar {

// The frame pool is append-only: a rolled-back step leaves its frames behind (they are
// shared, and a later step that needs the same frame finds it interned).
struct Matcher::State {
  explicit State(std::shared_ptr<const CompiledGrammar> grammar)
      : g(std::move(grammar)), pda(&g->automaton(), &pool, g->limits().max_stacks) {}
  State(const State& o)
      : g(o.g), pool(o.pool), pda(&g->automaton(), &pool, g->limits().max_stacks), history(o.history),
        terminated_at(o.terminated_at), status(o.status) {}

  std::shared_ptr<const CompiledGrammar> g;
  mutable FramePool pool;
  mutable Pda pda;
  std::vector<Position> history;  // history[0]: the start; back(): now
  int terminated_at = -1;         // the history index whose step accepted a stop token
  Status status;
  // Scratch for FillNextTokenBitmask.
  mutable WalkScratch walk;
  mutable std::vector<int32_t> pending;
  mutable std::vector<uint32_t> marks;
  Position next;

  const Vocabulary& vocab() const { return g->vocabulary(); }
  bool terminated() const { return terminated_at >= 0; }
  bool Commit(Position&& p) {
    if (p.dead()) {
      if (p.overflow) {
        status = ResourceExhausted("grammar too ambiguous: more than " + std::to_string(g->limits().max_stacks) +
                                   " parse stacks at one position");
      }
      return false;
    }
    history.push_back(std::move(p));
    return true;
  }
};

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> grammar) : s_(std::make_unique<State>(std::move(grammar))) {
  Reset();
}
Matcher::~Matcher() = default;
Matcher::Matcher(const Matcher& other) : s_(std::make_unique<State>(*other.s_)) {}
Matcher& Matcher::operator=(const Matcher& other) {
  if (this != &other) s_ = std::make_unique<State>(*other.s_);
  return *this;
}
Matcher::Matcher(Matcher&&) noexcept = default;
Matcher& Matcher::operator=(Matcher&&) noexcept = default;

void Matcher::Reset() {
  s_->history.clear();
  s_->terminated_at = -1;
  s_->status = Status::Ok();
  Position start;
  s_->pda.Close(s_->g->automaton().root_start(), kBottom, &start);
  s_->history.push_back(std::move(start));
}

bool Matcher::AcceptToken(int32_t id) {
  State& s = *s_;
  if (s.terminated()) return false;
  if (s.vocab().is_stop(id)) {
    if (!s.history.back().can_end) return false;
    s.history.push_back(Position{});
    s.terminated_at = static_cast<int>(s.history.size() - 1);
    return true;
  }
  if (!s.vocab().is_usable(id)) return false;
  s.pda.Run(s.history.back(), s.vocab().token(id), &s.next);
  return s.Commit(std::move(s.next));
}

bool Matcher::AcceptBytes(std::string_view bytes) {
  State& s = *s_;
  if (s.terminated()) return false;
  s.pda.Run(s.history.back(), bytes, &s.next);
  return s.Commit(std::move(s.next));
}

void Matcher::FillNextTokenBitmask(std::span<uint32_t> mask) const {
  const State& s = *s_;
  const Vocabulary& vocab = s.vocab();
  size_t words = BitmaskWords(vocab.size());
  KVF_CHECK(mask.size() >= words) << "mask of " << mask.size() << " words, vocabulary needs " << words;
  std::fill(mask.begin(), mask.end(), 0u);
  if (s.terminated()) return;
  const Position& now = s.history.back();
  auto sorted = vocab.sorted_ids();
  auto allow = [&](int32_t rank, bool accepted, bool) {
    if (accepted) mask[sorted[rank] / 32] |= 1u << (sorted[rank] % 32);
  };
  if (s.g->token_cache()) {
    // Cached: each top's context-independent tokens at once, then its uncertain tokens
    // (not allowed yet) walked from the real stacks, in byte order.
    s.pending.clear();
    if (s.marks.size() < words) s.marks.assign(words, 0);
    for (const Top& t : now.tops) {
      const auto& st = s.g->tokens(t.state);
      if (!st.accepted_bits.empty()) {
        for (size_t w = 0; w < words; ++w) mask[w] |= st.accepted_bits[w];
      }
      for (int32_t id : st.accepted) mask[id / 32] |= 1u << (id % 32);
    }
    for (const Top& t : now.tops) {
      for (int32_t rank : s.g->tokens(t.state).uncertain) {
        int32_t id = sorted[rank];
        uint32_t bit = 1u << (id % 32);
        if ((mask[id / 32] & bit) || (s.marks[id / 32] & bit)) continue;
        s.marks[id / 32] |= bit;
        s.pending.push_back(rank);
      }
    }
    for (int32_t rank : s.pending) s.marks[sorted[rank] / 32] = 0;
    if (now.tops.size() > 1) std::sort(s.pending.begin(), s.pending.end());
    WalkTokens(&s.pda, vocab, now, s.pending, &s.walk, allow);
  } else {
    // Uncached: the tokens whose first byte some top reads, walked in byte order.
    std::vector<char> first(256, 0);
    for (const Top& t : now.tops) {
      for (const auto& e : s.g->automaton().bytes(t.state)) std::fill(first.begin() + e.lo, first.begin() + e.hi + 1, 1);
    }
    auto offsets = vocab.first_byte_offsets();
    s.pending.clear();
    for (int b = 0; b < 256; ++b) {
      if (!first[b]) continue;
      for (uint32_t r = offsets[b]; r < offsets[b + 1]; ++r) s.pending.push_back(static_cast<int32_t>(r));
    }
    WalkTokens(&s.pda, vocab, now, s.pending, &s.walk, allow);
  }
  if (now.can_end) {
    for (int32_t id : vocab.stop_ids()) mask[id / 32] |= 1u << (id % 32);
  }
}

bool Matcher::CanTerminate() const { return !s_->terminated() && s_->history.back().can_end; }
bool Matcher::IsTerminated() const { return s_->terminated(); }

void Matcher::Rollback(int n) {
  State& s = *s_;
  KVF_CHECK(n >= 0 && n <= NumSteps()) << "rollback of " << n << " steps, " << NumSteps() << " taken";
  s.history.resize(s.history.size() - n);
  if (s.terminated_at >= static_cast<int>(s.history.size())) s.terminated_at = -1;
}

int Matcher::NumSteps() const { return static_cast<int>(s_->history.size()) - 1; }
Status Matcher::status() const { return s_->status; }
const CompiledGrammar& Matcher::grammar() const { return *s_->g; }

void Matcher::CheckInvariants() const {
  const State& s = *s_;
  KVF_CHECK(!s.history.empty());
  if (s.terminated()) KVF_CHECK_EQ(s.terminated_at, static_cast<int>(s.history.size()) - 1);
  for (size_t i = 1; i < s.history.size(); ++i) {
    if (static_cast<int>(i) != s.terminated_at) KVF_CHECK(!s.history[i].dead()) << "step " << i << " is dead";
  }
  const Automaton& a = s.g->automaton();
  for (const Top& t : s.history.back().tops) {
    KVF_CHECK(a.has_bytes(t.state)) << "top state " << t.state << " reads no byte";
    KVF_CHECK(t.parent == kBottom || static_cast<size_t>(t.parent) < s.pool.size());
  }
}

}  // namespace kvfleet::grammar
