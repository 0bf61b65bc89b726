#include "cli/simulate/fleet_sim.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <thread>

#include "common/check.h"
#include "common/log.h"

namespace kvfleet::sim {

namespace {

// The longest a shard's poll waits, so churn and counters stay current.
constexpr DurationNs kMaxPollWait = 5 * kNsPerMs;
// Time one poll pass may spend answering replays and snapshots (a 100,000-block snapshot
// takes milliseconds to encode): a router asking every worker of a shard for one at once
// must not hold back the shard's heartbeats, which a real worker's publisher thread sends
// whatever its neighbours do.
constexpr DurationNs kReplayBudget = 20 * kNsPerMs;
// How often a shard publishes its counters for Totals().
constexpr DurationNs kCountersInterval = 200 * kNsPerMs;
// Ports tried for one new worker before giving up: another process may hold a few.
constexpr int kBindAttempts = 16;

void Add(SimCounters* to, const SimCounters& c) {
  to->batches += c.batches;
  to->heartbeats += c.heartbeats;
  to->block_events += c.block_events;
  to->replays += c.replays;
  to->snapshots += c.snapshots;
  to->generates += c.generates;
  to->completed += c.completed;
  to->cancels += c.cancels;
  to->refused += c.refused;
  to->tokens += c.tokens;
  to->malformed += c.malformed;
}

}  // namespace

Status ValidateFleetSimOptions(const FleetSimOptions& o) {
  if (o.workers == 0) return InvalidArgument("--workers must be at least 1");
  if (o.threads == 0) return InvalidArgument("--threads must be at least 1");
  if (o.base_port == 0 || uint32_t{o.base_port} + 3ull * o.workers + 3 > 65535)
    return InvalidArgument("--base-port: " + std::to_string(o.workers) + " workers need " +
                           std::to_string(3 * o.workers) + " ports from it (up to " +
                           std::to_string(3 * (2 * o.workers + 64)) + " with churn), below 65536");
  if (!(o.churn_per_min >= 0 && o.churn_per_min <= 10)) return InvalidArgument("--churn must be in [0, 10] per minute");
  if (!(o.worker.events_per_s >= 0)) return InvalidArgument("--events-per-s must be >= 0");
  if (!(o.worker.initial_fill >= 0 && o.worker.initial_fill <= 1)) return InvalidArgument("--fill must be in [0, 1]");
  if (o.worker.tokens == 0) return InvalidArgument("--tokens must be at least 1");
  if (o.worker.token_delay < 0) return InvalidArgument("--token-delay-ms must be >= 0");
  if (!IsValidBlockSize(o.worker.block_size)) return InvalidArgument("--block-size must be a power of two");
  const SimKvCacheOptions& c = o.worker.cache;
  if (c.capacity_blocks <= uint64_t{c.shared_prefixes} * c.prefix_blocks + c.max_conversation_blocks + c.max_turn_blocks)
    return InvalidArgument("--blocks must exceed " +
                           std::to_string(uint64_t{c.shared_prefixes} * c.prefix_blocks + c.max_conversation_blocks +
                                          c.max_turn_blocks) +
                           ": the shared prefixes and one whole conversation");
  if (o.worker.router_endpoint.empty()) return InvalidArgument("--router is required");
  return Status::Ok();
}

PortSlots::PortSlots(uint16_t base_port, uint32_t slots) : base_(base_port), in_use_(slots, false) {}

Result<uint32_t> PortSlots::Take() {
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < in_use_.size(); ++i) {
    const uint32_t s = cursor_;
    cursor_ = (cursor_ + 1) % static_cast<uint32_t>(in_use_.size());
    if (!in_use_[s]) {
      in_use_[s] = true;
      return s;
    }
  }
  return Unavailable("every port slot from " + std::to_string(base_) + " is in use");
}

void PortSlots::Release(uint32_t slot) {
  std::lock_guard lock(mu_);
  in_use_[slot] = false;
}

// One thread's workers and the poll loop over them.
class FleetSim::Shard {
 public:
  Shard(FleetSim* sim, uint64_t seed) : sim_(sim), rng_(seed) {}
  ~Shard() { Join(); }

  void Adopt(std::unique_ptr<SimWorker> w, uint32_t slot) {
    workers_.push_back(std::move(w));
    slots_.push_back(slot);
    ++staying_;
  }
  SimCounters* counters() { return &counters_; }
  void Launch(const std::atomic<bool>* stop) {
    thread_ = std::thread([this, stop] { Loop(*stop); });
  }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  SimCounters Published() const {
    std::lock_guard lock(mu_);
    return published_;
  }
  Status status() const {
    std::lock_guard lock(mu_);
    return status_;
  }
  // The loop has ended (stopped, or failed: status()).
  bool done() const { return done_.load(std::memory_order_acquire); }

 private:
  void Loop(const std::atomic<bool>& stop);
  // Runs the timers that are due, waits for input (or the next timer) and handles it.
  void Pass(Clock* clock);
  void RebuildPollItems();
  // Starts the departures churn owes by `now`, and a new worker for each.
  Status Churn(TimeNs now);
  // Closes the workers that have left; returns whether any did.
  bool Reap(TimeNs now);
  // Every worker begins to leave; returns once all have gone.
  void LeaveAll(Clock* clock);

  FleetSim* const sim_;
  std::mt19937_64 rng_;
  std::vector<std::unique_ptr<SimWorker>> workers_;  // leaving ones too, until they have gone
  size_t staying_ = 0;                               // workers_ not leaving
  std::vector<uint32_t> slots_;  // workers_[i]'s port slot
  std::vector<zmq::pollitem_t> items_;  // replay, requests per worker
  SimCounters counters_;                // the shard thread's
  double churn_owed_ = 0;               // workers owed to churn
  TimeNs last_churn_ = 0;
  std::thread thread_;
  mutable std::mutex mu_;
  SimCounters published_;  // GUARDED_BY(mu_)
  Status status_;          // GUARDED_BY(mu_): why the loop stopped early
  std::atomic<bool> done_{false};
};

void FleetSim::Shard::RebuildPollItems() {
  items_.clear();
  for (auto& w : workers_) {
    items_.push_back(zmq::pollitem_t{w->replay_handle(), 0, ZMQ_POLLIN, 0});
    items_.push_back(zmq::pollitem_t{w->requests_handle(), 0, ZMQ_POLLIN, 0});
  }
}

Status FleetSim::Shard::Churn(TimeNs now) {
  const double per_s = sim_->options_.churn_per_min / 60.0 * static_cast<double>(staying_);
  churn_owed_ += per_s * static_cast<double>(now - last_churn_) / kNsPerSec;
  last_churn_ = now;
  bool changed = false;
  while (churn_owed_ >= 1 && staying_ > 0) {
    churn_owed_ -= 1;
    size_t i = rng_() % workers_.size();
    while (workers_[i]->leaving()) i = (i + 1) % workers_.size();
    workers_[i]->BeginLeave(now);
    --staying_;
    sim_->live_.fetch_sub(1, std::memory_order_relaxed);
    uint32_t slot = 0;
    KVF_ASSIGN_OR_RETURN(auto fresh, sim_->StartWorker(now, &counters_, &slot));
    Adopt(std::move(fresh), slot);
    changed = true;
  }
  if (changed) RebuildPollItems();
  return Status::Ok();
}

bool FleetSim::Shard::Reap(TimeNs now) {
  bool any = false;
  for (size_t i = workers_.size(); i-- > 0;) {
    if (!workers_[i]->Gone(now)) continue;
    sim_->slots_.Release(slots_[i]);
    workers_[i] = std::move(workers_.back());
    slots_[i] = slots_.back();
    workers_.pop_back();
    slots_.pop_back();
    any = true;
  }
  if (any) RebuildPollItems();
  return any;
}

void FleetSim::Shard::Pass(Clock* clock) {
  const TimeNs now = clock->Now();
  TimeNs next = now + kMaxPollWait;
  const TimeNs wall = clock->WallNs();
  for (auto& w : workers_) next = std::min(next, w->RunDue(now, wall));
  // Rounded up: a timer due in under a millisecond waits for it rather than spinning.
  const DurationNs wait = std::clamp<DurationNs>(next - clock->Now(), 0, kMaxPollWait);
  zmq::poll(items_.data(), items_.size(), std::chrono::milliseconds((wait + kNsPerMs - 1) / kNsPerMs));
  const TimeNs after = clock->Now();
  for (size_t i = 0; i < items_.size(); ++i) {
    if (!(items_[i].revents & ZMQ_POLLIN)) continue;
    SimWorker& w = *workers_[i / 2];
    if (i % 2 == 1) {
      w.OnRequests(after);
    } else if (clock->Now() - after < kReplayBudget) {
      w.OnReplay();  // past the budget, it waits for the next pass: the socket stays readable
    }
  }
}

void FleetSim::Shard::LeaveAll(Clock* clock) {
  for (auto& w : workers_) w->BeginLeave(clock->Now());
  sim_->live_.fetch_sub(static_cast<uint32_t>(staying_), std::memory_order_relaxed);
  staying_ = 0;
  while (!workers_.empty()) {
    Pass(clock);
    Reap(clock->Now());
  }
}

void FleetSim::Shard::Loop(const std::atomic<bool>& stop) {
  Clock* clock = SystemClock::Default();
  RebuildPollItems();
  last_churn_ = clock->Now();
  TimeNs next_publish = 0;
  Status status;
  while (!stop.load(std::memory_order_relaxed) && status.ok()) {
    Pass(clock);
    const TimeNs now = clock->Now();
    Reap(now);
    status = Churn(now);
    if (now >= next_publish) {
      std::lock_guard lock(mu_);
      published_ = counters_;
      next_publish = now + kCountersInterval;
    }
  }
  LeaveAll(clock);
  std::lock_guard lock(mu_);
  published_ = counters_;
  status_ = status;
  done_.store(true, std::memory_order_release);
}

FleetSim::FleetSim(const FleetSimOptions& options)
    : options_(options),
      context_(static_cast<int>(std::max(1u, options.threads))),
      slots_(options.base_port, std::min<uint32_t>((65535u - options.base_port) / 3, 2 * options.workers + 64)) {
  // Four sockets a worker, twice over for departed workers' sockets still lingering.
  context_.set(zmq::ctxopt::max_sockets, static_cast<int>(8 * options.workers + 256));
}

FleetSim::~FleetSim() {
  for (auto& s : shards_) s->Join();
}

Result<std::unique_ptr<SimWorker>> FleetSim::StartWorker(TimeNs now, SimCounters* counters, uint32_t* slot) {
  Status last;
  for (int attempt = 0; attempt < kBindAttempts; ++attempt) {
    KVF_ASSIGN_OR_RETURN(*slot, slots_.Take());
    SimWorkerOptions w = options_.worker;
    const uint64_t n = next_worker_.fetch_add(1);
    w.name = options_.name_prefix + "-" + std::to_string(n);
    w.requests_port = slots_.port(*slot, 0);
    w.events_port = slots_.port(*slot, 1);
    w.replay_port = slots_.port(*slot, 2);
    w.seed = options_.seed * 1'000'003 + n;
    auto worker = SimWorker::Start(context_, w, now, counters);
    if (worker.ok()) {
      live_.fetch_add(1, std::memory_order_relaxed);
      return worker;
    }
    last = worker.status();
    // The slot stays marked: a port some other process holds is not tried again.
  }
  return last;
}

SimCounters FleetSim::Totals() const {
  SimCounters total;
  for (const auto& s : shards_) Add(&total, s->Published());
  return total;
}

void FleetSim::LogProgress(const SimCounters& now, const SimCounters& before, double seconds) const {
  auto rate = [&](uint64_t a, uint64_t b) { return static_cast<double>(a - b) / std::max(seconds, 1e-9); };
  Logger("simulate")->info(
      "{} workers: {:.0f} batches/s, {:.0f} heartbeats/s, {:.0f} block events/s, {} snapshots, {} replays, "
      "{:.1f} requests/s, {} requests answered, {} refused while leaving, {} malformed frames",
      live_workers(), rate(now.batches, before.batches), rate(now.heartbeats, before.heartbeats),
      rate(now.block_events, before.block_events), now.snapshots, now.replays, rate(now.generates, before.generates),
      now.completed, now.refused, now.malformed);
}

Status FleetSim::Run(const std::atomic<bool>& stop) {
  KVF_RETURN_IF_ERROR(ValidateFleetSimOptions(options_));
  const uint32_t shards = std::min(options_.threads, options_.workers);
  for (uint32_t s = 0; s < shards; ++s) shards_.push_back(std::make_unique<Shard>(this, options_.seed * 7919 + s));
  const TimeNs now = SystemClock::Default()->Now();
  for (uint32_t i = 0; i < options_.workers; ++i) {
    Shard& shard = *shards_[i % shards];
    uint32_t slot = 0;
    auto w = StartWorker(now, shard.counters(), &slot);
    if (!w.ok()) return w.status();
    shard.Adopt(std::move(*w), slot);
  }
  Logger("simulate")->info("{} workers up, registering with {}; ports {}-{}", options_.workers,
                           options_.worker.router_endpoint, options_.base_port,
                           options_.base_port + 3 * options_.workers - 1);
  std::atomic<bool> shard_stop{false};
  for (auto& s : shards_) s->Launch(&shard_stop);
  const auto start = std::chrono::steady_clock::now();
  auto last = start;
  SimCounters before;
  while (!stop.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto t = std::chrono::steady_clock::now();
    if (options_.duration_s > 0 && t - start >= std::chrono::duration<double>(options_.duration_s)) break;
    if (std::any_of(shards_.begin(), shards_.end(), [](const auto& s) { return s->done(); })) break;
    const double since = std::chrono::duration<double>(t - last).count();
    if (options_.stats_interval_s > 0 && since >= options_.stats_interval_s) {
      const SimCounters totals = Totals();
      LogProgress(totals, before, since);
      before = totals;
      last = t;
    }
  }
  shard_stop = true;
  for (auto& s : shards_) s->Join();
  Logger("simulate")->info("stopped: every worker said Bye");
  for (const auto& s : shards_) KVF_RETURN_IF_ERROR(s->status());
  return Status::Ok();
}

}  // namespace kvfleet::sim
