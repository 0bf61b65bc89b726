// FleetImpl's forgetting of departed workers (fleet_impl.h): a worker gone (said bye, removed,
// its event stream DEAD, or unreachable) for longer than FleetOptions::forget_after loses its
// record, its sockets (the fleet's liveness DEALER and monitor; the lanes close theirs at their
// next sync; the event plane its replay DEALER and SUB connection), its index entries and its
// per-worker metric series, and its id goes back for a new worker. Refusals are forgotten
// after the same time. So a fleet whose pods come and go with new addresses keeps a bounded
// registry and socket count. What a forgotten worker held (its index entries: ~170 bytes a
// block) goes back to the system too: glibc keeps freed pages in its arenas, so with workers
// forgotten, malloc_trim returns them, at most once per kTrimEvery.
//
// Thread safety: thread-safe, as FleetImpl; runs on the fleet thread.
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include <prometheus/family.h>
#include <prometheus/gauge.h>

#include "common/log.h"
#include "router/fleet/fleet_impl.h"

namespace kvfleet::router {

namespace {
constexpr DurationNs kTrimEvery = 30 * kNsPerSec;
}  // namespace

TimeNs FleetImpl::GoneSince(WorkerRecord& w, TimeNs now) const {
  if (w.removed.load() || w.said_bye.load()) {
    if (w.gone_since == 0) w.gone_since = now;
    return w.gone_since;
  }
  w.gone_since = 0;  // back within the grace
  if (w.from_static) return 0;  // listed by the flags or DNS: kept until they drop it
  // A registered worker re-sends its Hello every 2 s while it runs: unreachable or DEAD, it
  // is gone since its last one.
  const bool dead = signals_ != nullptr && signals_->State(w.id) == WorkerState::kDead;
  return !w.connected.load() || dead ? std::max<TimeNs>(w.last_hello, 1) : 0;
}

void FleetImpl::ForgetGone() {
  const TimeNs now = clock_->Now();
  // A quarter of the grace is soon enough, and spares each tick the walk over every worker.
  const DurationNs every = std::clamp<DurationNs>(options_.forget_after / 4, options_.tick, kNsPerSec);
  if (now - last_forget_check_ < every) return;
  last_forget_check_ = now;
  std::vector<WorkerId> forget;
  {
    std::shared_lock<std::shared_mutex> lock(mu_);
    for (auto& w : workers_) {
      if (!w) continue;
      const TimeNs since = GoneSince(*w, now);
      if (since != 0 && now - since >= options_.forget_after) forget.push_back(w->id);
    }
  }
  for (WorkerId id : forget) Forget(id, "gone for " + std::to_string(options_.forget_after / kNsPerSec) + " s");
  if (!forget.empty() && now - last_trim_ >= kTrimEvery) {
    last_trim_ = now;
    const auto t0 = std::chrono::steady_clock::now();
    ::malloc_trim(0);
    const auto took = std::chrono::steady_clock::now() - t0;
    Logger("fleet")->debug("malloc_trim after forgetting {} workers: {} ms", forget.size(),
                           std::chrono::duration_cast<std::chrono::milliseconds>(took).count());
  }
  std::unique_lock<std::shared_mutex> lock(mu_);
  for (auto it = refused_at_.begin(); it != refused_at_.end();) {
    if (now - it->second < options_.forget_after) {
      ++it;
      continue;
    }
    refused_.erase(it->first);
    it = refused_at_.erase(it);
  }
  std::erase_if(refusals_logged_, [&](const std::string& key) {
    return !refused_.contains(key.substr(0, key.rfind('|')));
  });
}

bool FleetImpl::ForgetLongestGone() {
  const TimeNs now = clock_->Now();
  std::optional<WorkerId> oldest;
  TimeNs oldest_since = 0;
  {
    std::shared_lock<std::shared_mutex> lock(mu_);
    for (auto& w : workers_) {
      if (!w) continue;
      const TimeNs since = GoneSince(*w, now);
      if (since == 0) continue;
      // One that said bye (or was removed) is gone for sure; one unreachable or DEAD only once
      // its claim has lapsed: a worker that just registered is not connected yet either.
      const bool left = w->said_bye.load() || w->removed.load();
      if (!left && now - since < options_.registration_auth.lease) continue;
      if (!oldest || since < oldest_since) {
        oldest = w->id;
        oldest_since = since;
      }
    }
  }
  if (!oldest) return false;
  Forget(*oldest, "gone " + std::to_string((now - oldest_since) / kNsPerMs) +
                      " ms, the longest of the fleet's gone workers, to make room for a new one (--max-workers)");
  return true;
}

void FleetImpl::Forget(WorkerId id, const std::string& why) {
  std::unique_ptr<WorkerRecord> record;
  bool name_shared = false;  // series are per name: another record may hold them
  {
    std::unique_lock<std::shared_mutex> lock(mu_);
    WorkerRecord* w = Record(id);
    if (w == nullptr) return;
    auto by_endpoint = by_endpoint_.find(w->info.requests_endpoint);
    if (by_endpoint != by_endpoint_.end() && by_endpoint->second == id) by_endpoint_.erase(by_endpoint);
    if (auto model = models_.find(w->info.model); model != models_.end()) std::erase(model->second.members, id);
    MoveDevice(id, w->info.device_id, "");
    for (const auto& other : workers_) {
      name_shared = name_shared || (other && other.get() != w &&
                                    (other->info.name == w->info.name || other->inflight_gauge == w->inflight_gauge));
    }
    retired_failures_[id] = w->failures.load() + 1;  // requests still sent there fail over
    if (options_.peers != nullptr) options_.peers->NameWorker(id, "");
    record = std::move(workers_[id]);
    --records_;
    free_ids_.insert(id);
  }
  Disconnect(*record);
  if (signals_) signals_->RemoveWorker(id);
  if (!name_shared && inflight_family_ != nullptr && record->inflight_gauge != nullptr) {
    inflight_family_->Remove(record->inflight_gauge);
  }
  if (options_.on_forgotten) options_.on_forgotten(id, record->info.name, !name_shared);
  Logger("fleet")->info("worker {} ({}) forgotten: {}", record->info.name, record->info.requests_endpoint, why);
}

}  // namespace kvfleet::router
