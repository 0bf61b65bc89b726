#include "worker/server/kv_pulls.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <random>
#include <utility>

#include "common/block_hash.h"
#include "common/log.h"
#include "schema/event_codec.h"

namespace kvfleet::server {

KvPulls::KvPulls(const KvPullsOptions& options, transfer::TransferService* service, kv::KvCacheManager* kv,
                 backend::ModelBackend* backend, engine::Engine* engine, backend::KvNccl* nccl)
    : options_(options), service_(service), kv_(kv), backend_(backend), engine_(engine), nccl_(nccl) {
  // Communicator numbers from a random start: a restarted holder never repeats one a receiver keeps.
  next_comm_ = std::random_device{}() | (uint64_t{std::random_device{}()} << 32) | 1;
  const backend::KvTransferFormat format = backend_->kv_transfer_format();
  const std::optional<transfer::KvDtype> dtype = transfer::ParseKvDtype(format.dtype);
  if (!dtype) {
    unsupported_ = format.unsupported.empty() ? "KV format '" + format.dtype + "' has no Contract 4 name" : format.unsupported;
  } else if (!format.scales.empty()) {
    unsupported_ = "fp8 KV blocks carry per-model scales, which Contract 4's layout does not name yet";
  } else if (static_cast<uint32_t>(backend_->block_size()) != kv_->block_size() || !kv_->reuse_enabled()) {
    unsupported_ = "this worker's KV blocks are not its routing blocks, or it keeps no reusable prefix";
  } else {
    transfer::Layout l;
    l.dtype = *dtype;
    l.block_size = kv_->block_size();
    for (const backend::KvPoolInfo& p : backend_->pools()) {
      l.pools.push_back(transfer::PoolGeometry{static_cast<uint32_t>(p.window), static_cast<uint32_t>(p.layers.size()),
                                               static_cast<uint32_t>(p.num_kv_heads), static_cast<uint32_t>(p.head_dim),
                                               p.bytes_per_block});
    }
    layout_ = std::move(l);
    streams_.emplace(service_, kv_, backend_, *layout_);
    device_ = !options_.host_id.empty() && !backend_->ExportKvDevice().empty();
  }
}

std::string ThisHostId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return id;
}

bool KvPulls::WaitForPull(engine::RequestId id, const engine::GenerateRequest& request) {
  if (pending_.empty()) return false;
  const uint32_t B = kv_->block_size();
  const uint64_t seed = HashSeed(HashNamespace{options_.model, request.lora, request.cache_salt});
  for (auto& [transfer_id, p] : pending_) {
    const uint32_t k = p.plan.first_block;  // the request must hold blocks 0..k of the pulled chain
    if (p.seed != seed || request.prompt.size() <= size_t{k + 1} * B) continue;
    if (!std::equal(p.tokens.begin(), p.tokens.begin() + size_t{k + 1} * B, request.prompt.begin())) continue;
    p.waiters.push_back(id);
    engine_->Hold(id);
    ++stats_.waited;
    return true;
  }
  return false;
}

void KvPulls::Start(engine::RequestId id, const engine::GenerateRequest& request, const PullHint& hint) {
  if (service_ == nullptr || !layout_) return;
  if (WaitForPull(id, request)) return;
  if (hint.source.empty() || hint.blocks == 0 || hint.source == options_.own_endpoint) return;
  const uint32_t B = kv_->block_size();
  // The last prompt token is always computed: its block is never worth a pull.
  const uint32_t n = std::min<uint64_t>(hint.blocks, (request.prompt.size() - 1) / B);
  if (n == 0) {
    ++stats_.skipped;
    return;
  }
  kv::SequenceSpec spec;
  spec.prompt.assign(request.prompt.begin(), request.prompt.begin() + size_t{n} * B);
  spec.model = options_.model;
  spec.lora = request.lora;
  spec.cache_salt = request.cache_salt;
  spec.retention = request.retention;
  // The pulled blocks are a second copy: stored, and reused by this request, below the default.
  spec.retention.token_ranges.push_back(kv::TokenRangeRetention{0, n * B, config::kPulledPriority, std::nullopt});
  std::vector<TokenId> tokens = spec.prompt;
  Result<kv::ImportPlan> plan = kv_->BeginImport(std::move(spec));
  if (!plan.ok() || plan->first_block >= plan->num_blocks) {
    if (plan.ok()) kv_->EndImport(*plan, 0);
    ++stats_.skipped;
    Logger("transfer")->debug("request {}: no pull of {} blocks from {}: {}", id, n, hint.source,
                              plan.ok() ? "this worker holds them" : plan.status().ToString());
    return;
  }
  engine_->LowerRetention(id, config::kPulledPriority);
  const BlockHasher hasher(B, HashNamespace{options_.model, request.lora, request.cache_salt});
  const std::vector<BlockHash> hashes = hasher.HashAll(tokens);
  transfer::PullRequest pull;
  pull.model = options_.model;
  pull.lora = request.lora;
  pull.cache_salt = request.cache_salt;
  pull.block_size = B;
  pull.parent_hash = plan->first_block == 0 ? 0 : hashes[plan->first_block - 1];
  pull.hashes.assign(hashes.begin() + plan->first_block, hashes.end());
  pull.layout = *layout_;
  if (device_ && no_device_sources_.count(hint.source) == 0) pull.host_id = options_.host_id;
  if (nccl()) {
    pull.nccl = true;
    pull.nccl_comm = nccl_->CommFor(hint.source);
  }
  // The router's bound (twice its predicted time), within this worker's own.
  const auto max_ms = static_cast<uint32_t>(std::max<DurationNs>(1, options_.deadline / kNsPerMs));
  pull.deadline_ms = hint.deadline_ms > 0 ? std::min(hint.deadline_ms, max_ms) : max_ms;
  const uint64_t transfer_id = service_->StartPull(hint.source, hint.server_key, std::move(pull));
  Pending p;
  p.request = id;
  p.plan = *plan;
  p.tokens = std::move(tokens);
  p.seed = hasher.seed();
  p.source = hint.source;
  p.started = service_->Now();
  pending_.emplace(transfer_id, std::move(p));
  engine_->Hold(id);
  ++stats_.started;
}

void KvPulls::ReleaseKept(bool all) {
  auto done = [&](const Kept& k) {
    if (!all && std::any_of(k.requests.begin(), k.requests.end(),
                            [&](engine::RequestId r) { return engine_->AwaitsAdmission(r); })) {
      return false;
    }
    kv_->ReleaseImport(k.plan);
    return true;
  };
  kept_.erase(std::remove_if(kept_.begin(), kept_.end(), done), kept_.end());
}

void KvPulls::Poll() {
  if (service_ == nullptr) return;
  // Admitted since the last Poll, a request's own sequence holds its pulled chain now. Kept
  // chains yield when the cache is short: a request waiting ahead did not fit, or a running one
  // was preempted (without the first, a request ahead that fits only without them waits for
  // ever, and with nothing running the scheduler would call it unfittable).
  if (!kept_.empty()) {
    const engine::StepReport& step = engine_->last_step();
    ReleaseKept(step.preemptions > 0 || step.kv_short);
  }
  if (!waiting_.empty()) {
    std::vector<transfer::IncomingPull> waiting;
    waiting.swap(waiting_);
    for (const transfer::IncomingPull& pull : waiting) Serve(pull, /*waited=*/true);
  }
  for (const transfer::IncomingPull& pull : service_->TakePulls()) Serve(pull, /*waited=*/false);
  for (const transfer::Released& r : service_->TakeReleases()) {
    if (r.nccl) {
      NcclAnswered(r);
      continue;
    }
    if (r.stream) {
      if (streams_) streams_->Ended(r);
      continue;
    }
    auto it = held_.find({r.peer_token, r.transfer_id});
    if (it == held_.end()) continue;
    kv_->UnpinChain(it->second);
    held_.erase(it);
  }
  stats_.device_held = held_.size();
  if (streams_) {
    streams_->Pump();
    stats_.bytes_held = streams_->streams();
  }
  std::vector<transfer::PullResult> results = service_->TakeResults();
  // Taken after the results: every block of a result just taken is among these.
  for (const transfer::Arrival& a : service_->TakeArrivals()) WriteArrival(a);
  for (transfer::PullResult& result : results) {
    // An answer this side will not receive: its holder sends it all the same, so the pair's
    // communicator would pair that send with a later receive. It is not used again.
    if (result.nccl_abandoned && nccl_ != nullptr) nccl_->Forget(result.source);
    auto it = pending_.find(result.transfer_id);
    if (it == pending_.end()) continue;
    if (result.nccl && ReceiveNccl(it->second, result)) continue;  // ends in PollNccl
    Finish(it->second, result);
    pending_.erase(it);
  }
  PollNccl();
  stats_.nccl_held = nccl_held_.size();
  stats_.kept_blocks = 0;
  for (const Kept& k : kept_) stats_.kept_blocks += k.plan.num_blocks;
  stats_.in_flight = pending_.size();
  stats_.held_requests = 0;
  for (const auto& [id, p] : pending_) stats_.held_requests += 1 + p.waiters.size();
}

std::vector<PullTotals> KvPulls::TakeChangedPullTotals() {
  std::vector<PullTotals> changed;
  for (const std::string& source : changed_totals_) changed.push_back(totals_.at(source));
  changed_totals_.clear();
  return changed;
}

uint32_t KvPulls::ComputingRun(const transfer::PullRequest& r) const {
  uint32_t run = kv_->LiveRun(r.parent_hash, r.hashes);
  // A request queued here and not yet admitted has no KV sequence: its prompt is hashed here.
  const uint32_t B = kv_->block_size();
  const HashNamespace ns{options_.model, r.lora, r.cache_salt};
  const uint64_t seed = HashSeed(ns);
  const BlockHasher hasher(B, ns);
  for (const engine::Sequence* seq : engine_->scheduler().waiting()) {
    if (run == r.hashes.size()) break;
    if (seq->kv_registered) continue;  // LiveRun saw it
    if (HashSeed(HashNamespace{options_.model, seq->request.lora, seq->request.cache_salt}) != seed) continue;
    const std::span<const TokenId> prompt(seq->tokens.data(), seq->prompt_len);
    const size_t full = prompt.size() / B;
    size_t k = 0;  // the prompt's block that r.hashes[0] would be
    uint64_t h = hasher.seed();
    if (r.parent_hash != 0) {
      while (k < full && h != r.parent_hash) {
        h = hasher.Next(h, prompt.subspan(k * B, B));
        ++k;
      }
      if (h != r.parent_hash) continue;
    }
    uint32_t n = 0;
    for (; n < r.hashes.size() && k + n < full; ++n) {
      h = hasher.Next(h, prompt.subspan((k + n) * B, B));
      if (h != r.hashes[n]) break;
    }
    run = std::max(run, n);
  }
  return run;
}

bool KvPulls::WaitForBlocks(const transfer::IncomingPull& pull, bool waiting) {
  const transfer::PullRequest& r = pull.request;
  const uint32_t held = kv_->HeldRun(r.parent_hash, r.hashes);
  if (held >= r.hashes.size() || ComputingRun(r) <= held) {
    if (waiting) ++stats_.serve_waits_stored;
    return false;
  }
  // Half the deadline: the receiver gave it twice the pull it expects (the router's
  // PullDeadline), and the bytes still have to go.
  const TimeNs cutoff = pull.deadline - static_cast<DurationNs>(r.deadline_ms) * kNsPerMs / 2;
  if (service_->Now() >= cutoff) {
    if (waiting) ++stats_.serve_waits_cut;
    return false;
  }
  waiting_.push_back(pull);
  return true;
}

void KvPulls::Serve(const transfer::IncomingPull& pull, bool waited) {
  const transfer::PullRequest& r = pull.request;
  auto refuse = [&](transfer::RefusalReason reason, std::string why) {
    ++stats_.refused_requests;
    service_->Refuse(pull.peer_token, r.transfer_id, reason, std::move(why));
  };
  if (!layout_) return refuse(transfer::RefusalReason::kLayoutMismatch, unsupported_);
  if (r.layout != *layout_) {
    return refuse(transfer::RefusalReason::kLayoutMismatch,
                  "this worker's KV blocks are " + std::string(transfer::KvDtypeName(layout_->dtype)) + ", " +
                      std::to_string(layout_->block_size) + " tokens, " + std::to_string(layout_->pools.size()) +
                      " pools of its own geometry; the pull's layout differs");
  }
  if (r.model != options_.model) {
    return refuse(transfer::RefusalReason::kNotHeld, "this worker serves '" + options_.model + "', not '" + r.model + "'");
  }
  if (WaitForBlocks(pull, waited)) return;  // blocks this worker is still computing
  if (ServeDevice(pull) || ServeNccl(pull)) return;
  // Pinned until the service says its last frame left (or the transfer ended early); Poll
  // reads it a frame at a time.
  if (!streams_->Start(pull)) return refuse(transfer::RefusalReason::kNotHeld, "this worker holds none of the chain now");
  ++stats_.served_requests;
}

bool KvPulls::ServeDevice(const transfer::IncomingPull& pull) {
  const transfer::PullRequest& r = pull.request;
  if (!device_ || r.host_id != options_.host_id || held_.count({pull.peer_token, r.transfer_id}) != 0) return false;
  std::vector<kv::ExportedBlock> run = PinDeviceRun(r);
  std::vector<std::string> handles;
  if (!run.empty()) handles = backend_->ExportKvDevice();
  if (handles.empty()) {
    kv_->UnpinChain(run);
    return false;
  }
  const size_t n = run.size();
  transfer::DeviceRun out;
  out.handles = std::move(handles);
  for (size_t i = 0; i < n; ++i) {
    transfer::DeviceBlock& b = out.blocks.emplace_back();
    b.index = static_cast<uint32_t>(i);
    b.hash = run[i].hash;
    b.tokens = run[i].tokens;
    for (const kv::BlockLocation& l : run[i].pools) b.slots.push_back(static_cast<uint32_t>(l.block));
  }
  held_.emplace(std::pair(pull.peer_token, r.transfer_id), std::move(run));
  ++stats_.served_requests;
  ++stats_.device_served;
  service_->ServeDevice(pull.peer_token, r.transfer_id, std::move(out));
  return true;
}

std::vector<kv::ExportedBlock> KvPulls::PinDeviceRun(const transfer::PullRequest& r) {
  std::vector<kv::ExportedBlock> run = kv_->PinChain(r.parent_hash, r.hashes);
  size_t n = 0;  // the leading run on the device; a block on the host tier goes as bytes
  while (n < run.size() && std::all_of(run[n].pools.begin(), run[n].pools.end(),
                                       [](const kv::BlockLocation& l) { return l.tier == kv::Tier::kDevice; })) {
    ++n;
  }
  kv_->UnpinChain(std::span(run).subspan(n));
  run.resize(n);
  return run;
}

uint32_t KvPulls::CopyFromDevice(Pending& p, const transfer::PullResult& result, uint32_t good) {
  const transfer::DeviceRun& run = *result.device;
  std::vector<kv::BlockId> src(good), dst(good);
  const auto start = std::chrono::steady_clock::now();
  uint64_t bytes = 0;
  for (size_t pool = 0; pool < layout_->pools.size(); ++pool) {
    const kv::PoolView view = kv_->View(p.plan.seq, static_cast<uint32_t>(pool));
    for (uint32_t j = 0; j < good; ++j) {
      src[j] = run.blocks[j].slots[pool];
      dst[j] = view.linear[p.plan.first_block + j];
    }
    if (Status st = backend_->CopyKvBlocksFromPeer(static_cast<uint32_t>(pool), run.handles[pool], src, dst);
        !st.ok()) {
      Logger("transfer")->warn("pull {} from {}: {}; its blocks come as bytes from now on", result.transfer_id,
                               result.source, st.ToString());
      no_device_sources_.insert(result.source);
      return 0;
    }
    bytes += uint64_t{good} * layout_->pools[pool].bytes_per_block;
  }
  ++stats_.device_pulls;
  service_->RecordDeviceCopy(result.source, bytes,
                             std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return good;
}

void KvPulls::WriteArrival(const transfer::Arrival& a) {
  auto it = pending_.find(a.transfer_id);
  if (it == pending_.end()) return;  // the pull has ended here
  Pending& p = it->second;
  const uint32_t first = p.arrived;
  p.arrived += static_cast<uint32_t>(a.blocks.size());
  if (p.stopped || a.first != first) {
    p.stopped = true;
    return;
  }
  const uint32_t B = kv_->block_size();
  const uint32_t wanted = p.plan.num_blocks - p.plan.first_block;
  // The holder's tokens must be the prompt's: a hash collision costs a miss, never wrong KV.
  uint32_t n = 0;
  for (; n < a.blocks.size(); ++n) {
    const std::span<const TokenId> tokens = a.blocks[n].tokens;
    const size_t at = size_t{p.plan.first_block + first + n} * B;
    if (first + n >= wanted || tokens.size() != B || !std::equal(tokens.begin(), tokens.end(), p.tokens.begin() + at)) {
      p.stopped = true;
      break;
    }
  }
  if (n > 0 && layout_->dtype != transfer::KvDtype::kNone) {
    // Straight from the received frame, no gather: one call per pool, its blocks' copies overlapped.
    std::vector<kv::BlockId> dst(n);
    std::vector<std::span<const std::byte>> src(n);
    for (size_t pool = 0; pool < layout_->pools.size(); ++pool) {
      const kv::PoolView view = kv_->View(p.plan.seq, static_cast<uint32_t>(pool));
      for (uint32_t j = 0; j < n; ++j) {
        dst[j] = view.linear[p.plan.first_block + first + j];
        src[j] = a.blocks[j].data[pool];
      }
      if (Status st = backend_->WriteKvBlocksFrom(static_cast<uint32_t>(pool), dst, src); !st.ok()) {
        Logger("transfer")->error("pull {}: writing the blocks failed: {}", a.transfer_id, st.ToString());
        ++stats_.write_failures;
        p.stopped = true;
        p.write_failed = true;
        return;
      }
    }
  }
  p.written += n;
}

uint32_t KvPulls::CountGood(const Pending& p, const transfer::PullResult& result, size_t received) {
  if (result.outcome != transfer::PullOutcome::kOk) return 0;
  const uint32_t B = kv_->block_size();
  const uint32_t wanted = p.plan.num_blocks - p.plan.first_block;
  uint32_t good = 0;
  // The holder's tokens must be the prompt's: a hash collision costs a miss, never wrong KV.
  for (size_t j = 0; j < received; ++j) {
    const std::vector<TokenId>& tokens = result.device ? result.device->blocks[j].tokens : result.nccl->blocks[j].tokens;
    const size_t at = size_t{p.plan.first_block + good} * B;
    if (good >= wanted || !std::equal(tokens.begin(), tokens.end(), p.tokens.begin() + at)) break;
    ++good;
  }
  if (good < received) ++stats_.token_mismatches;
  return good;
}

void KvPulls::Finish(Pending& p, transfer::PullResult& result) {
  const bool ok = result.outcome == transfer::PullOutcome::kOk;
  size_t received = 0;
  uint32_t good = 0;
  bool copy_failed = false, late = false;
  if (result.device) {
    received = result.device->blocks.size();
    good = CountGood(p, result, received);
    // The holder keeps the run pinned until its deadline plus kDeviceHoldGrace, no longer. Its
    // deadline runs from the pull's arrival there, after this side's start, on the same host's
    // monotonic clock: so until this side's deadline plus half the grace the run is still
    // pinned, with half the grace left for the copy. A run reached later, behind long steps
    // here, may be reused there by now: it is not copied.
    const TimeNs copy_by = result.deadline + transfer::config::kDeviceHoldGrace / 2;
    late = good > 0 && result.deadline > 0 && service_->Now() > copy_by;
    if (late) good = 0;
    if (good > 0) {
      const uint32_t copied = CopyFromDevice(p, result, good);
      copy_failed = copied < good;
      good = copied;
    }
    service_->ReleasePull(result.transfer_id);
  } else if (result.nccl) {
    received = result.nccl->blocks.size();
    CountGood(p, result, received);
    good = 0;  // an NCCL run not received (ReceiveNccl could not post it)
  } else if (ok) {
    // Bytes: written as they arrived (WriteArrival). Only a pull that ended ok makes them a
    // run; one that failed midway (a bad checksum, the deadline) stores none of them, and
    // the request computes over what was written.
    received = result.streamed_blocks;
    copy_failed = p.write_failed;
    good = copy_failed ? 0 : std::min<uint32_t>(p.written, result.streamed_blocks);
    if (!copy_failed && good < received) ++stats_.token_mismatches;
  }
  const std::string why = late                      ? "late"
                          : copy_failed             ? "copy_failed"
                          : ok && result.nccl       ? "nccl_failed"
                          : ok && good < received   ? "token_mismatch"
                          : ok                      ? "short"
                                                    : std::string(PullOutcomeName(result.outcome));
  Complete(p, good, why, result.status);
}

void KvPulls::Complete(Pending& p, uint32_t good, const std::string& why, const Status& status) {
  const uint32_t wanted = p.plan.num_blocks - p.plan.first_block;
  // A whole chain stays referenced until its requests are admitted (ReleaseKept). One cut
  // short is stored and let go: its request computes the rest in blocks of its own, and
  // keeping the import would hold the unwritten ones too.
  if (good > 0 && good == wanted) {
    kv_->StoreImport(p.plan, good);
    Kept k{p.plan, {p.request}};
    k.requests.insert(k.requests.end(), p.waiters.begin(), p.waiters.end());
    kept_.push_back(std::move(k));
  } else {
    kv_->EndImport(p.plan, good);
  }
  stats_.imported_blocks += good;
  const TimeNs elapsed = std::max<TimeNs>(0, service_->Now() - p.started);
  // What the request waited for its prefix: from the pull's start to its blocks stored here,
  // or to its fallback (a router prices a pair whose pulls fail by what they cost). As many
  // holders as a load report may carry: a fleet has fewer, and a hint may name any endpoint.
  if (totals_.contains(p.source) || totals_.size() < events::config::kMaxPullSources) {
    const double seconds = static_cast<double>(elapsed) / kNsPerSec;
    PullTotals& t = totals_[p.source];
    t.source = p.source;
    if (good > 0) {
      t.pulls += 1;
      t.bytes += uint64_t{good} * layout_->BytesPerBlock();
      t.seconds += seconds;
    } else {
      t.failed += 1;
      t.failed_seconds += seconds;
    }
    changed_totals_.insert(p.source);
  }
  if (good < wanted) {
    ++stats_.fallbacks[why];
    Logger("transfer")->debug("request {}: a pull from {} brought {} of {} blocks in {:.1f} ms ({}): {}", p.request,
                              p.source, good, wanted, static_cast<double>(elapsed) / kNsPerMs,
                              why, status.ToString());
  }
  engine_->Unhold(p.request);
  for (engine::RequestId w : p.waiters) engine_->Unhold(w);
}

}  // namespace kvfleet::server
