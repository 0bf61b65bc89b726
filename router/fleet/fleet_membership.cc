// FleetImpl's membership (fleet_impl.h): who joins and leaves. The registration socket's
// Hellos and Byes, each admitted by Membership (membership.h) before the registry sees it,
// and the DNS answers that list static workers. Both run on the fleet thread (its loop,
// fleet.cc).
//
// Thread safety: thread-safe, as FleetImpl.
#include <optional>
#include <shared_mutex>
#include <string>
#include <variant>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/family.h>

#include "common/log.h"
#include "router/fleet/fleet_impl.h"

namespace kvfleet::router {

Status FleetImpl::BindRegistration() {
  const RegistrationAuth& auth = options_.registration_auth;
  if (options_.registration_endpoint.empty()) return Status::Ok();
  std::optional<RegistrationKeys> keys;
  if (!auth.authorized_keys_file.empty()) {
    if (options_.curve.client_keypair_file.empty()) {
      return InvalidArgument("registration keys need the router's own key pair (--curve-keypair)");
    }
    keys.emplace();
    KVF_ASSIGN_OR_RETURN(keys->server, LoadCurveKeyPair(options_.curve.client_keypair_file));
    KVF_ASSIGN_OR_RETURN(keys->authorized, LoadAuthorizedKeys(auth.authorized_keys_file));
  }
  auto on_refused = [this](const std::string& key) {  // the ZAP thread
    if (refused_family_ != nullptr) refused_family_->Add({{"reason", "unauthenticated"}}).Increment();
    uint64_t suppressed = 0;
    if (registration_log_.Allow(&suppressed)) {
      Logger("fleet")->warn("registration: refused a peer with {} ({} more suppressed)",
                            key.empty() ? std::string("no CURVE key") : "unknown key " + key, suppressed);
    }
  };
  return registration_.Bind(ctx_, options_.registration_endpoint, keys, auth.insecure, on_refused);
}

// A Hello or Bye from the registration socket.
void FleetImpl::OnRegistration(const ToRouterMessage& message, const RegistrationPeer& peer) {
  const auto* hello = std::get_if<WorkerHello>(&message);
  Status admitted = hello != nullptr ? membership_.AdmitHello(*hello, peer, clock_->Now())
                                     : membership_.AdmitBye(std::get<WorkerBye>(message), peer);
  if (!admitted.ok()) {
    // A Bye of a run its replacement has already replaced: a restart's ordinary overlap.
    const bool stale = admitted.code() == StatusCode::kNotFound;
    if (refused_family_ != nullptr) {
      refused_family_->Add({{"reason", hello != nullptr ? "hello-not-owner" : stale ? "bye-stale" : "bye-not-owner"}})
          .Increment();
    }
    uint64_t suppressed = 0;
    if (registration_log_.Allow(&suppressed)) {
      Logger("fleet")->log(stale ? spdlog::level::info : spdlog::level::warn,
                           "registration: refused: {} ({} more suppressed)", admitted.message(), suppressed);
    }
    return;
  }
  if (hello != nullptr) {
    AddOrUpdate(*hello, HelloSource::kRegistered);
    return;
  }
  const WorkerBye& bye = std::get<WorkerBye>(message);
  std::vector<WorkerId> gone;
  {
    std::unique_lock<std::shared_mutex> lock(mu_);
    std::erase_if(refused_, [&](const auto& entry) { return entry.second.info.name == bye.name; });
    for (auto& w : workers_) {
      if (w && w->info.name == bye.name && (bye.epoch == 0 || w->info.epoch == bye.epoch)) {
        w->said_bye = true;
        gone.push_back(w->id);
      }
    }
  }
  // No new requests go there (Routable), but those in flight finish: the worker completes
  // them within its shutdown grace (or cancels them, which the lanes pass on), and one
  // that vanishes first fails over when its connection drops.
  if (!gone.empty()) Logger("fleet")->info("worker {} said bye", bye.name);
}

// --- DNS ---

void FleetImpl::ApplyDns(size_t source, const std::vector<std::string>& endpoints) {
  DnsSource& dns = dns_sources_[source];
  std::vector<std::string> joined, left;
  dns.members.Update(endpoints, &joined, &left);
  for (const auto& ep : joined) AddOrUpdate(StaticHello(ep, dns.fleet), HelloSource::kListed);
  for (const auto& ep : left) RemoveByEndpoint(ep);
}

void FleetImpl::RemoveByEndpoint(const std::string& endpoint) {
  WorkerRecord* w = nullptr;
  {
    std::unique_lock<std::shared_mutex> lock(mu_);
    auto it = by_endpoint_.find(endpoint);
    if (it == by_endpoint_.end()) return;
    w = workers_[it->second].get();
    if (!w->from_static) return;  // it registered itself: its Hellos and Byes decide
    w->removed = true;
    std::erase(models_[w->info.model].members, w->id);
  }
  Logger("fleet")->info("worker {} left the DNS answer", w->info.name);
  FailWorker(w->id, Unavailable("worker removed from DNS"));
  Disconnect(*w);
  if (signals_) signals_->RemoveWorker(w->id);
}

}  // namespace kvfleet::router
