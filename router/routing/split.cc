// Router: P/D disaggregation, the split of one request's prefill from its decode (README.md,
// "Prefill and decode on different workers").
#include <algorithm>
#include <limits>

#include "router/routing/router.h"

namespace kvfleet::router {

bool Router::TrySplit(std::span<const Candidate> prefill_pool, std::span<const Candidate> decode_pool,
                      double whole_ttft_s, Decision* d) {
  const RouteRequest& route = d->route;
  const uint32_t threshold = options().split_prefill_tokens;
  const auto full = static_cast<uint32_t>(d->hashes.size());
  if (threshold == 0 || full == 0 || !(options().transfer_bytes_per_s > 0) || decode_pool.empty()) return false;
  // Conditional split: a long prompt that no decode-capable worker holds, while the prefill
  // pool keeps up (below). A held or short one costs less computed in place than a second hop
  // and a pull, unless the decode pool is behind: then it splits when that gives its first
  // token sooner (decode workers compute prompts slowly beside their decodes, by design:
  // worker/engine/scheduler.h, kDecodeRoleStepOverDecodes).
  uint32_t held = 0;
  for (const Candidate& c : decode_pool) held = std::max(held, c.device_blocks + c.host_blocks);
  const uint32_t cached = std::min(route.prompt_tokens, held * route.block_size);
  const bool long_prompt = route.prompt_tokens - cached >= threshold;

  // The prefill: the policy's cost (cached prefix and prefill queue) over the prefill workers
  // that serve pulls, admitted as a whole request would be.
  std::vector<Candidate> prefill;
  for (const Candidate& c : prefill_pool) {
    std::shared_ptr<const TransferPeer> peer = loads_->Transfer(c.worker);
    if (peer && peer->bytes_per_block > 0) prefill.push_back(c);
  }
  if (prefill.empty()) return false;
  std::vector<double> ttft;
  auto prefill_admitted = std::make_shared<std::vector<Candidate>>(Admissible(route, prefill, &ttft));
  if (prefill_admitted->empty()) return false;
  Result<Choice> p = picker_.Pick(d->policy, route, *prefill_admitted);
  if (!p.ok()) return false;
  const Candidate& pre = (*prefill_admitted)[p->index];
  const std::shared_ptr<const TransferPeer> from = loads_->Transfer(pre.worker);
  const double prefill_rate = picker_.FleetRate(prefill);
  const double prefill_ttft = picker_.EstimateTtft(route, pre, prefill_rate);
  if (prefill_ttft > whole_ttft_s) return false;  // below, with the decode's wait

  // The decode: every decode-capable worker of the same KV format, with the prompt's full
  // blocks pulled from the prefill worker. Its cost is then its decode load (running requests,
  // the admission wait its report gives when its batch or KV cache is full) and the pull.
  std::vector<Candidate> decode;
  const PairReads reads = ReadPairs();
  for (const Candidate& c : decode_pool) {
    std::shared_ptr<const TransferPeer> to = loads_->Transfer(c.worker);
    if (!to || to->format != from->format) continue;
    const uint32_t have = c.device_blocks + c.host_blocks;
    const bool same_host = !from->host_id.empty() && from->host_id == to->host_id;
    decode.push_back(have < full ? WithPull(c, pre.worker, *from, same_host, full - have, reads) : c);
  }
  if (decode.empty()) return false;  // no decode worker can take the prefill worker's KV
  auto decode_admitted = std::make_shared<std::vector<Candidate>>(Admissible(route, decode, &ttft));
  if (decode_admitted->empty()) return false;
  Result<Choice> c = picker_.Pick(d->policy, route, *decode_admitted);
  if (!c.ok()) return false;
  const Candidate& chosen = (*decode_admitted)[c->index];
  // Moving the KV must cost less than computing it where it is decoded: else the split only
  // delays the first token (a slow link, or a cheap model).
  const double decode_rate = std::max(chosen.prefill_tokens_per_s, picker_.FleetRate(decode_pool));
  const double recompute_s = static_cast<double>(route.prompt_tokens - cached) / decode_rate;
  if (chosen.pull_s > recompute_s) return false;
  const double decode_rate_floor = picker_.FleetRate(decode);
  // A decode-role worker admits the pulled prompt ahead of its queued prompts and runs it with
  // its decodes (worker/engine/README.md): the estimate counts no queue there, and for admission
  // only its report's pulledWaitUs (Candidate::role).
  const double decode_ttft = picker_.EstimateTtft(route, chosen, decode_rate_floor);
  // Only while the prefill pool keeps up: split, the first token comes after the prefill and
  // then the decode worker's part (its queue or the pull, the prompt's last partial block);
  // whole, after the best decode-capable worker's wait and prefill. The split may cost what it
  // costs on an idle fleet, the decode worker's part without its queue, no more (Dynamo
  // computes a prompt locally when its prefill queue is long). So the pools' queues even out
  // instead of the prefill pool's growing without bound when long prompts outrun it.
  // A short or held prompt splits only when that is sooner outright: the decode pool is behind.
  Candidate idle = chosen;
  idle.queued_prefill_tokens = idle.admission_wait_s = idle.pulled_wait_s = 0;
  const double split_cost_s = long_prompt ? picker_.EstimateTtft(route, idle, decode_rate_floor) : 0;
  if (prefill_ttft + decode_ttft > whole_ttft_s + split_cost_s + 1e-6) return false;  // 1 µs: rounding
  const double bound = options().admission_ttft_s;
  if (bound > 0 && prefill_ttft + decode_ttft > bound) return false;  // whole, it may still be in time

  d->worker = chosen.worker;
  d->device_blocks = chosen.device_blocks - chosen.pull_blocks;  // what it holds itself
  d->host_blocks = chosen.host_blocks;
  d->predicted_cached_tokens = c->predicted_cached_tokens;
  d->estimated_ttft_s = prefill_ttft + decode_ttft;
  // The decode worker gives up its pull at its break-even, as for any pull. Not sooner: a split
  // prompt given up is computed twice, once on each worker, which a loaded fleet cannot spare
  // (2026-11-29-pd-mock8.txt: 115 of 445 pulls missed a deadline of twice the predicted pull).
  const uint32_t deadline_ms = PullDeadlineMs(route, chosen, decode_rate_floor);
  d->pull = PullHint{from->endpoint, from->key, full, from->name, deadline_ms};
  d->pull_from = pre.worker;
  d->split = SplitPrefill{pre.worker, p->predicted_cached_tokens, full, prefill_ttft, chosen.pull_s, deadline_ms,
                          std::move(prefill_admitted), std::nullopt};
  if (options().calibrate_ttft) d->split->ttft_terms = picker_.Terms(route, pre, prefill_rate);
  d->candidates = std::move(decode_admitted);
  return true;
}

double Router::IdleSplitTtft(std::span<const Candidate> prefill_pool, std::span<const Candidate> decode_pool,
                             const RouteRequest& route, uint32_t full_blocks) const {
  double best = std::numeric_limits<double>::infinity();
  const Candidate* pre = nullptr;
  std::shared_ptr<const TransferPeer> from;
  const double prefill_rate = picker_.FleetRate(prefill_pool);
  for (const Candidate& c : prefill_pool) {
    std::shared_ptr<const TransferPeer> peer = loads_->Transfer(c.worker);
    if (!peer || peer->bytes_per_block == 0) continue;
    const double ttft = picker_.EstimateTtft(route, Idle(c), prefill_rate);
    if (ttft < best) {
      best = ttft;
      pre = &c;
      from = std::move(peer);
    }
  }
  if (pre == nullptr) return best;
  const double decode_rate = picker_.FleetRate(decode_pool);
  double part = std::numeric_limits<double>::infinity();
  const PairReads reads = ReadPairs();
  for (const Candidate& c : decode_pool) {
    std::shared_ptr<const TransferPeer> to = loads_->Transfer(c.worker);
    if (!to || to->format != from->format) continue;
    const uint32_t have = c.device_blocks + c.host_blocks;
    const bool same_host = !from->host_id.empty() && from->host_id == to->host_id;
    const Candidate pulled = have < full_blocks ? WithPull(c, pre->worker, *from, same_host, full_blocks - have, reads) : c;
    part = std::min(part, picker_.EstimateTtft(route, Idle(pulled), decode_rate));
  }
  return best + part;
}

std::function<Result<WorkerId>(std::span<const WorkerId> tried)> Router::PrefillRerouter(const Decision& decision) {
  return MakeRerouter(decision.policy, decision.route, decision.lora_id, decision.split->candidates);
}

std::function<PullHint(WorkerId prefill_worker)> Router::SplitPull(const Decision& decision) {
  return [loads = loads_, blocks = decision.split->blocks,
          deadline_ms = decision.split->pull_deadline_ms](WorkerId prefill_worker) -> PullHint {
    std::shared_ptr<const TransferPeer> peer = loads->Transfer(prefill_worker);
    if (!peer) return {};
    return PullHint{peer->endpoint, peer->key, blocks, peer->name, deadline_ms};
  };
}

}  // namespace kvfleet::router
