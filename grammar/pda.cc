#include "grammar/pda.h"

#include <algorithm>

namespace kvfleet::grammar {

void Pda::AddTop(Top t, Position* out) {
  if (std::find(out->tops.begin(), out->tops.end(), t) != out->tops.end()) return;
  if (out->tops.size() >= max_stacks_) {
    out->overflow = true;
    return;
  }
  out->tops.push_back(t);
}

void Pda::Close(int32_t state, int32_t parent, Position* out) {
  const Automaton::State& st = a_->state(state);
  if (st.calls_begin == st.calls_end && !st.final) {  // the common case: nothing to expand
    AddTop({state, parent}, out);
    return;
  }
  work_.clear();
  work_.push_back({state, parent});
  while (!work_.empty()) {
    Top t = work_.back();
    work_.pop_back();
    if (std::find(seen_.begin(), seen_.end(), t) != seen_.end()) continue;
    // Bounded: without left recursion (refused at build) every expansion is finite, and the
    // seen set caps the work at the stack limit.
    if (seen_.size() >= 4 * max_stacks_) {
      out->overflow = true;
      return;
    }
    seen_.push_back(t);
    if (a_->has_bytes(t.state)) AddTop(t, out);
    for (const auto& c : a_->calls(t.state)) {
      work_.push_back({a_->rule_start(c.rule), pool_->Intern(c.target, t.parent)});
    }
    if (a_->state(t.state).final) {
      if (t.parent == kBottom) {
        out->can_end = true;
      } else {
        const auto& f = pool_->frame(t.parent);
        work_.push_back({f.state, f.parent});
      }
    }
  }
}

void Pda::Step(const Position& in, uint8_t b, Position* out) {
  out->Clear();
  if (in.tops.size() == 1) {  // the common case: one stack, a state that needs no closure
    const Top t = in.tops[0];
    int32_t next = a_->Next(t.state, b);
    if (next < 0) return;
    if (a_->simple(next)) {
      out->tops.push_back({next, t.parent});
      return;
    }
  }
  seen_.clear();
  for (const Top& t : in.tops) {
    int32_t next = a_->Next(t.state, b);
    if (next >= 0) Close(next, t.parent, out);
  }
  if (out->overflow) {
    out->tops.clear();
    out->can_end = false;
  }
}

void Pda::Run(const Position& in, std::string_view bytes, Position* out) {
  *out = in;
  for (char c : bytes) {
    if (out->tops.empty()) {
      out->can_end = false;
      return;
    }
    Step(*out, static_cast<uint8_t>(c), &scratch_);
    std::swap(*out, scratch_);
  }
}

}  // namespace kvfleet::grammar
