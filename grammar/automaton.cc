#include "grammar/automaton.h"

#include <algorithm>
#include <map>
#include <unordered_map>

#include <xxhash.h>

#include "common/check.h"

namespace kvfleet::grammar {

namespace {

// One UTF-8 sequence shape: a byte range per position.
using Utf8Seq = std::vector<std::pair<uint8_t, uint8_t>>;

void EncodeUtf8(uint32_t cp, uint8_t* out, int* n) {
  std::string s;
  AppendUtf8(cp, &s);
  *n = static_cast<int>(s.size());
  for (int i = 0; i < *n; ++i) out[i] = static_cast<uint8_t>(s[i]);
}

// Splits [lo, hi] into ranges whose UTF-8 encodings are products of byte ranges (the
// construction of Russ Cox's RE2 and Rust's regex-syntax utf8 module). Surrogates are
// skipped: they have no UTF-8 encoding.
void SplitUtf8(uint32_t lo, uint32_t hi, std::vector<Utf8Seq>* out) {
  if (lo > hi) return;
  if (lo < 0xD800 && hi >= 0xD800) {
    SplitUtf8(lo, 0xD7FF, out);
    SplitUtf8(0xE000, hi, out);
    return;
  }
  if (lo >= 0xD800 && lo <= 0xDFFF) {
    SplitUtf8(0xE000, hi, out);
    return;
  }
  for (uint32_t max : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= max && hi > max) {
      SplitUtf8(lo, max, out);
      SplitUtf8(max + 1, hi, out);
      return;
    }
  }
  if (hi < 0x80) {
    out->push_back({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}});
    return;
  }
  for (int i = 1; i < 4; ++i) {
    uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        SplitUtf8(lo, lo | m, out);
        SplitUtf8((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        SplitUtf8(lo, (hi & ~m) - 1, out);
        SplitUtf8(hi & ~m, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  int na, nb;
  EncodeUtf8(lo, a, &na);
  EncodeUtf8(hi, b, &nb);
  Utf8Seq seq;
  for (int i = 0; i < na; ++i) seq.push_back({a[i], b[i]});
  out->push_back(std::move(seq));
}

Status TooLarge(const std::string& what, size_t limit) {
  return InvalidArgument("grammar too large: more than " + std::to_string(limit) + " " + what);
}

struct SetHash {
  size_t operator()(const std::vector<int32_t>& v) const { return XXH3_64bits(v.data(), v.size() * sizeof(int32_t)); }
};

// One rule's Thompson NFA: state 0 is the start, `accept` the single accepting state.
struct Nfa {
  struct Node {
    std::vector<Automaton::ByteEdge> bytes;
    std::vector<Automaton::CallEdge> calls;
    std::vector<int32_t> eps;
  };
  std::vector<Node> nodes;
  int32_t accept = -1;
};

}  // namespace

namespace config {
// A linear scan of up to this many edges is about as fast as the table's cache miss.
constexpr size_t kTableMinEdges = 6;
// Subset elements looked up per allowed DFA state: real grammars average a few; the
// blow-ups that fill the state budget carry dozens each.
constexpr size_t kSubsetWorkPerState = 16;
}  // namespace config

// Deep enough for any schema or grammar a person writes, shallow enough for the stack.
constexpr int kMaxExprDepth = 1000;

// Builds the automaton rule by rule; every step charges a shared state budget.
class AutomatonBuilder {
 public:
  AutomatonBuilder(const Grammar& g, const BuildLimits& limits) : g_(g), limits_(limits) {}

  Result<Automaton> Run() {
    KVF_RETURN_IF_ERROR(g_.CheckComplete());
    if (g_.num_rules() > limits_.max_rules) return TooLarge("rules", limits_.max_rules);
    a_.rule_start_.assign(g_.num_rules(), -1);
    for (size_t r = 0; r < g_.num_rules(); ++r) a_.rule_names_.push_back(g_.rule(r).name);
    a_.root_rule_ = g_.root();
    for (size_t r = 0; r < g_.num_rules(); ++r) {
      Nfa nfa;
      nfa.nodes.emplace_back();
      auto end = Emit(&nfa, g_.rule(r).body, 0, 0);
      if (!end.ok()) return end.status();
      nfa.accept = *end;
      KVF_RETURN_IF_ERROR(Determinize(nfa, static_cast<int32_t>(r)));
    }
    KVF_RETURN_IF_ERROR(Trim());
    KVF_RETURN_IF_ERROR(CheckLeftRecursion());
    BuildTables();
    return std::move(a_);
  }

 private:
  Result<int32_t> NewNode(Nfa* nfa) {
    if (++nfa_states_ > limits_.max_states) return TooLarge("automaton states", limits_.max_states);
    nfa->nodes.emplace_back();
    return static_cast<int32_t>(nfa->nodes.size() - 1);
  }

  // Emits expression e starting at node `from`; returns the node where it ends.
  Result<int32_t> Emit(Nfa* nfa, int32_t e, int32_t from, int depth) {
    // Expressions nest as deep as the front end's input (e.g. "a"?????...): bounded here.
    if (depth > kMaxExprDepth) return InvalidArgument("grammar too large: expressions nested deeper than " + std::to_string(kMaxExprDepth));
    const Expr& x = g_.expr(e);
    switch (x.type) {
      case Expr::Type::kBytes: {
        int32_t cur = from;
        for (char c : x.bytes) {
          KVF_ASSIGN_OR_RETURN(int32_t next, NewNode(nfa));
          auto b = static_cast<uint8_t>(c);
          nfa->nodes[cur].bytes.push_back({b, b, next});
          cur = next;
        }
        return cur;
      }
      case Expr::Type::kClass: {
        KVF_ASSIGN_OR_RETURN(int32_t end, NewNode(nfa));
        std::vector<Utf8Seq> seqs;
        for (const auto& r : x.ranges) SplitUtf8(r.lo, r.hi, &seqs);
        for (const auto& seq : seqs) {
          int32_t cur = from;
          for (size_t i = 0; i < seq.size(); ++i) {
            int32_t next = end;
            if (i + 1 < seq.size()) {
              KVF_ASSIGN_OR_RETURN(next, NewNode(nfa));
            }
            nfa->nodes[cur].bytes.push_back({seq[i].first, seq[i].second, next});
            cur = next;
          }
        }
        return end;
      }
      case Expr::Type::kSeq: {
        int32_t cur = from;
        for (int32_t c : x.children) {
          KVF_ASSIGN_OR_RETURN(cur, Emit(nfa, c, cur, depth + 1));
        }
        return cur;
      }
      case Expr::Type::kAlt: {
        KVF_ASSIGN_OR_RETURN(int32_t end, NewNode(nfa));
        for (int32_t c : x.children) {
          KVF_ASSIGN_OR_RETURN(int32_t start, NewNode(nfa));
          nfa->nodes[from].eps.push_back(start);
          KVF_ASSIGN_OR_RETURN(int32_t stop, Emit(nfa, c, start, depth + 1));
          nfa->nodes[stop].eps.push_back(end);
        }
        return end;
      }
      case Expr::Type::kRef: {
        KVF_ASSIGN_OR_RETURN(int32_t end, NewNode(nfa));
        nfa->nodes[from].calls.push_back({x.rule, end});
        return end;
      }
      case Expr::Type::kRepeat: {
        // Each copy costs at least one node, so a huge count runs into the budget quickly.
        int32_t cur = from;
        for (int32_t i = 0; i < x.min; ++i) {
          KVF_ASSIGN_OR_RETURN(int32_t start, NewNode(nfa));
          nfa->nodes[cur].eps.push_back(start);
          KVF_ASSIGN_OR_RETURN(cur, Emit(nfa, x.children[0], start, depth + 1));
        }
        KVF_ASSIGN_OR_RETURN(int32_t end, NewNode(nfa));
        nfa->nodes[cur].eps.push_back(end);
        if (x.max == Expr::kUnbounded) {
          KVF_ASSIGN_OR_RETURN(int32_t stop, Emit(nfa, x.children[0], end, depth + 1));
          nfa->nodes[stop].eps.push_back(end);
          return end;
        }
        for (int32_t i = x.min; i < x.max; ++i) {
          KVF_ASSIGN_OR_RETURN(int32_t start, NewNode(nfa));
          nfa->nodes[cur].eps.push_back(start);
          KVF_ASSIGN_OR_RETURN(cur, Emit(nfa, x.children[0], start, depth + 1));
          nfa->nodes[cur].eps.push_back(end);
        }
        return end;
      }
    }
    return Internal("unknown expression type");
  }

  // Adds the states reachable by epsilon moves and sorts the set. Cost: the set's size
  // (seen_ is stamped per call, not cleared).
  void Closure(const Nfa& nfa, std::vector<int32_t>* set) {
    if (seen_.size() < nfa.nodes.size()) seen_.resize(nfa.nodes.size(), 0);
    if (++stamp_ == 0) {
      std::fill(seen_.begin(), seen_.end(), 0);
      stamp_ = 1;
    }
    work_.assign(set->begin(), set->end());
    for (int32_t s : *set) seen_[s] = stamp_;
    while (!work_.empty()) {
      int32_t s = work_.back();
      work_.pop_back();
      for (int32_t t : nfa.nodes[s].eps) {
        if (seen_[t] != stamp_) {
          seen_[t] = stamp_;
          set->push_back(t);
          work_.push_back(t);
        }
      }
    }
    std::sort(set->begin(), set->end());
  }

  Status Determinize(const Nfa& nfa, int32_t rule) {
    std::unordered_map<std::vector<int32_t>, int32_t, SetHash> ids;
    std::vector<std::vector<int32_t>> pending;
    auto id_of = [&](std::vector<int32_t> set) -> Result<int32_t> {
      Closure(nfa, &set);
      // Subsets can be large (a pattern's open ends track many positions at once): the
      // work, not only the state count, is bounded.
      subset_work_ += set.size();
      if (subset_work_ > config::kSubsetWorkPerState * limits_.max_states) {
        return TooLarge("automaton states' worth of determinization work", limits_.max_states);
      }
      auto it = ids.find(set);
      if (it != ids.end()) return it->second;
      if (a_.states_.size() >= limits_.max_states) return TooLarge("automaton states", limits_.max_states);
      auto id = static_cast<int32_t>(a_.states_.size());
      Automaton::State st;
      st.rule = rule;
      st.final = std::binary_search(set.begin(), set.end(), nfa.accept);
      a_.states_.push_back(st);
      ids.emplace(set, id);
      pending.push_back(std::move(set));
      return id;
    };
    KVF_ASSIGN_OR_RETURN(a_.rule_start_[rule], id_of({0}));
    // States are processed in creation order, so each state's edges are contiguous.
    for (size_t next = static_cast<size_t>(a_.rule_start_[rule]); next < a_.states_.size(); ++next) {
      std::vector<int32_t> set = pending[next - a_.rule_start_[rule]];
      // A sweep over the edges' ends: between two consecutive ends the active edges (and so
      // the target set) do not change.
      events_.clear();
      std::map<int32_t, std::vector<int32_t>> calls;
      for (int32_t s : set) {
        for (const auto& e : nfa.nodes[s].bytes) {
          events_.push_back({e.lo, e.target, +1});
          events_.push_back({uint32_t{e.hi} + 1, e.target, -1});
        }
        for (const auto& c : nfa.nodes[s].calls) calls[c.rule].push_back(c.target);
      }
      std::sort(events_.begin(), events_.end(), [](const Event& a, const Event& b) { return a.at < b.at; });
      a_.states_[next].bytes_begin = static_cast<uint32_t>(a_.byte_edges_.size());
      std::vector<Automaton::ByteEdge> out;
      active_.clear();
      for (size_t k = 0; k < events_.size();) {
        uint32_t at = events_[k].at;
        for (; k < events_.size() && events_[k].at == at; ++k) {
          if (events_[k].delta > 0) {
            active_.push_back(events_[k].target);
          } else {
            active_.erase(std::find(active_.begin(), active_.end(), events_[k].target));
          }
        }
        if (active_.empty() || k == events_.size()) continue;
        uint32_t lo = at, hi = events_[k].at - 1;
        std::vector<int32_t> targets = active_;
        std::sort(targets.begin(), targets.end());
        targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
        KVF_ASSIGN_OR_RETURN(int32_t t, id_of(std::move(targets)));
        if (!out.empty() && out.back().target == t && out.back().hi + 1u == lo) {
          out.back().hi = static_cast<uint8_t>(hi);
        } else {
          out.push_back({static_cast<uint8_t>(lo), static_cast<uint8_t>(hi), t});
        }
      }
      std::vector<Automaton::CallEdge> call_out;
      for (auto& [r, targets] : calls) {
        KVF_ASSIGN_OR_RETURN(int32_t t, id_of(targets));
        call_out.push_back({r, t});
      }
      // id_of may have grown the vector; index again rather than hold a reference.
      a_.byte_edges_.insert(a_.byte_edges_.end(), out.begin(), out.end());
      a_.states_[next].bytes_end = static_cast<uint32_t>(a_.byte_edges_.size());
      a_.states_[next].calls_begin = static_cast<uint32_t>(a_.call_edges_.size());
      a_.call_edges_.insert(a_.call_edges_.end(), call_out.begin(), call_out.end());
      a_.states_[next].calls_end = static_cast<uint32_t>(a_.call_edges_.size());
    }
    return Status::Ok();
  }

  // A state is live when it can complete its rule: a least fixpoint over byte edges and
  // calls of live rules, by a worklist over reverse edges (linear in the automaton).
  Status Trim() {
    size_t n = a_.states_.size();
    std::vector<std::vector<int32_t>> preds(n);         // via a byte edge or as a call's return state
    std::vector<std::vector<int32_t>> callers(a_.rule_start_.size());  // states calling rule r
    for (size_t s = 0; s < n; ++s) {
      for (const auto& e : a_.bytes(static_cast<int32_t>(s))) preds[e.target].push_back(static_cast<int32_t>(s));
      for (const auto& c : a_.calls(static_cast<int32_t>(s))) {
        preds[c.target].push_back(static_cast<int32_t>(s));
        callers[c.rule].push_back(static_cast<int32_t>(s));
      }
    }
    std::vector<char> live(n, 0);
    std::vector<int32_t> work;
    auto is_live = [&](int32_t s) {
      for (const auto& e : a_.bytes(s)) if (live[e.target]) return true;
      for (const auto& c : a_.calls(s)) if (live[c.target] && live[a_.rule_start_[c.rule]]) return true;
      return a_.states_[s].final;
    };
    for (size_t s = 0; s < n; ++s) {
      if (a_.states_[s].final) { live[s] = 1; work.push_back(static_cast<int32_t>(s)); }
    }
    while (!work.empty()) {
      int32_t s = work.back();
      work.pop_back();
      auto wake = [&](int32_t p) {
        if (!live[p] && is_live(p)) { live[p] = 1; work.push_back(p); }
      };
      for (int32_t p : preds[s]) wake(p);
      if (a_.rule_start_[a_.states_[s].rule] == s) {
        for (int32_t p : callers[a_.states_[s].rule]) wake(p);
      }
    }
    if (!live[a_.root_start()]) {
      return InvalidArgument("grammar matches no finite string: rule '" + a_.rule_names_[a_.root_rule_] + "' never completes");
    }
    // Drop edges into dead states; edges stay contiguous per state.
    std::vector<Automaton::ByteEdge> bytes;
    std::vector<Automaton::CallEdge> calls;
    for (size_t s = 0; s < n; ++s) {
      auto& st = a_.states_[s];
      uint32_t b0 = static_cast<uint32_t>(bytes.size()), c0 = static_cast<uint32_t>(calls.size());
      for (const auto& e : a_.bytes(static_cast<int32_t>(s))) if (live[e.target]) bytes.push_back(e);
      for (const auto& c : a_.calls(static_cast<int32_t>(s))) {
        if (live[c.target] && live[a_.rule_start_[c.rule]]) calls.push_back(c);
      }
      st.bytes_begin = b0;
      st.bytes_end = static_cast<uint32_t>(bytes.size());
      st.calls_begin = c0;
      st.calls_end = static_cast<uint32_t>(calls.size());
    }
    a_.byte_edges_ = std::move(bytes);
    a_.call_edges_ = std::move(calls);
    return Status::Ok();
  }

  // States with many byte edges (UTF-8 classes) get a direct 256-entry lookup.
  void BuildTables() {
    for (size_t s = 0; s < a_.states_.size(); ++s) {
      auto edges = a_.bytes(static_cast<int32_t>(s));
      if (edges.size() < config::kTableMinEdges) continue;
      a_.states_[s].table = static_cast<int32_t>(a_.tables_.size() / 256);
      a_.tables_.resize(a_.tables_.size() + 256, -1);
      int32_t* row = a_.tables_.data() + a_.tables_.size() - 256;
      for (const auto& e : edges) std::fill(row + e.lo, row + e.hi + 1, e.target);
    }
  }

  // Left recursion makes a stack's closure infinite (each call pushes a new frame), so it
  // is refused: a rule may not reach a call of itself through calls of nullable rules only.
  Status CheckLeftRecursion() {
    size_t n = a_.states_.size(), nr = a_.rule_start_.size();
    // nullable states: final, or a call of a nullable rule returning to a nullable state.
    std::vector<char> nullable(n, 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t s = n; s-- > 0;) {
        if (nullable[s]) continue;
        bool v = a_.states_[s].final;
        for (const auto& c : a_.calls(static_cast<int32_t>(s))) {
          v = v || (nullable[c.target] && nullable[a_.rule_start_[c.rule]]);
        }
        if (v) { nullable[s] = 1; changed = true; }
      }
    }
    // first[r]: the rules r can call before reading a byte.
    std::vector<std::vector<int32_t>> first(nr);
    std::vector<int32_t> seen(n, -1);
    for (size_t r = 0; r < nr; ++r) {
      std::vector<int32_t> work{a_.rule_start_[r]};
      seen[a_.rule_start_[r]] = static_cast<int32_t>(r);
      while (!work.empty()) {
        int32_t s = work.back();
        work.pop_back();
        for (const auto& c : a_.calls(s)) {
          first[r].push_back(c.rule);
          if (nullable[a_.rule_start_[c.rule]] && seen[c.target] != static_cast<int32_t>(r)) {
            seen[c.target] = static_cast<int32_t>(r);
            work.push_back(c.target);
          }
        }
      }
    }
    // Cycle search (iterative DFS, colours: 0 new, 1 on the path, 2 done).
    std::vector<char> colour(nr, 0);
    for (size_t r0 = 0; r0 < nr; ++r0) {
      if (colour[r0]) continue;
      std::vector<std::pair<int32_t, size_t>> path{{static_cast<int32_t>(r0), 0}};
      colour[r0] = 1;
      while (!path.empty()) {
        auto& [r, i] = path.back();
        if (i < first[r].size()) {
          int32_t next = first[r][i++];
          if (colour[next] == 1) {
            return InvalidArgument("grammar is left-recursive through rule '" + a_.rule_names_[next] + "'");
          }
          if (colour[next] == 0) {
            colour[next] = 1;
            path.push_back({next, 0});
          }
        } else {
          colour[r] = 2;
          path.pop_back();
        }
      }
    }
    return Status::Ok();
  }

  const Grammar& g_;
  BuildLimits limits_;
  Automaton a_;
  size_t nfa_states_ = 0;
  size_t subset_work_ = 0;
  struct Event {
    uint32_t at;  // a byte value, or 256
    int32_t target;
    int delta;    // +1: an edge starts at `at`; -1: one ended just before
  };
  std::vector<Event> events_;
  std::vector<int32_t> active_;
  std::vector<uint32_t> seen_;  // Closure's visited marks
  uint32_t stamp_ = 0;
  std::vector<int32_t> work_;
};

Result<Automaton> Automaton::Build(const Grammar& grammar, const BuildLimits& limits) {
  return AutomatonBuilder(grammar, limits).Run();
}

void Automaton::CheckInvariants() const {
  for (size_t s = 0; s < states_.size(); ++s) {
    auto b = bytes(static_cast<int32_t>(s));
    for (size_t i = 1; i < b.size(); ++i) KVF_CHECK(b[i - 1].hi < b[i].lo) << "state " << s;
    auto c = calls(static_cast<int32_t>(s));
    for (size_t i = 1; i < c.size(); ++i) KVF_CHECK(c[i - 1].rule < c[i].rule) << "state " << s;
  }
}

}  // namespace kvfleet::grammar
