#include "router/fleet/gossip.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <zmq.hpp>

#include "common/curve_keys.h"
#include "common/log.h"
#include "common/thread_priority.h"
#include "common/zmq_threads.h"
#include "router/fleet/discovery.h"
#include "schema/limits.h"

namespace kvfleet::router {

namespace {

// Reasons a frame is refused (kvfleet_router_gossip_refused_total{reason}): besides
// PeerLoads' own, a frame that does not decode, one that breaks a bound, one of more than one
// part, this router's own, and a subscriber without the fleet's key (ZAP).
constexpr const char* kReasons[] = {"malformed", "invalid", "multipart", "self",
                                    "stale", "too_many_peers", "too_many_workers", "unauthenticated"};

// The bound endpoint, naming this host where it binds every address: routers behind one
// DNS name bind the same tcp://0.0.0.0:PORT, and the router id must tell them apart.
std::string DefaultRouterId(const std::string& endpoint) {
  for (const char* any : {"://0.0.0.0:", "://*:", "://[::]:"}) {
    const size_t at = endpoint.find(any);
    if (at == std::string::npos) continue;
    char host[256] = {0};
    if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == 0) return endpoint;
    return endpoint.substr(0, at + 3) + host + endpoint.substr(at + std::string_view(any).size() - 1);
  }
  return endpoint;
}

}  // namespace

GossipWorker ToGossipWorker(const std::string& worker, const OwnLoadCounts& own) {
  auto count = [](double v, double most) { return static_cast<uint64_t>(std::clamp(v, 0.0, most)); };
  GossipWorker w;
  w.worker = worker;
  w.requests = static_cast<uint32_t>(count(own.requests, 4e9));
  w.waiting = static_cast<uint32_t>(count(own.waiting, w.requests));
  const double most_tokens = static_cast<double>(w.waiting) * static_cast<double>(wire::limits::kMaxContextTokens);
  w.prompt_tokens = count(own.prompt_tokens, most_tokens);
  w.prefill_tokens = count(own.prefill_tokens, static_cast<double>(w.prompt_tokens));
  return w;
}

class Gossip::Impl {
 public:
  Impl(const GossipOptions& options, GossipSource source, PeerLoads* peers, const Clock* clock)
      : options_(options), source_(std::move(source)), peers_(peers), clock_(clock) {
    std::random_device rd;
    incarnation_ = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(clock->Now());
  }
  ~Impl() {
    Stop();
    if (wake_fd_ >= 0) ::close(wake_fd_);
  }

  Status Init(prometheus::Registry* registry);
  void Stop();
  void Loop();
  void OwnStateChanged(bool routed);

  const std::string& endpoint() const { return endpoint_; }
  const std::string& router_id() const { return router_id_; }
  uint64_t sent() const { return sent_.load(); }
  uint64_t applied() const { return applied_.load(); }

 private:
  Status Bind();
  Status ConnectPeers();
  // Publishes now when the gap since the last message allows, else returns when it will.
  // `heartbeat`: when nothing went out for an interval, else returns when that will be.
  // Gossip thread only.
  std::optional<TimeNs> PublishWhenDue(TimeNs now, bool heartbeat);
  // Reads the state and sends it (or counts it dropped while the channel is down).
  // REQUIRES: publish_mu_ held, pub_ open.
  void PublishLocked(TimeNs now);
  // Reads what the SUB holds, at most a bounded batch, applying or refusing each frame.
  void Drain();
  void Receive(const zmq::message_t& frame);
  void Refuse(const char* reason, const std::string& why);
  // Connects the SUB to the peers the last DNS answer added, and disconnects those it dropped.
  void ApplyDnsAnswer();
  // True (and counted) while GossipOptions::faults says the channel is down.
  bool ChannelDown();

  GossipOptions options_;
  GossipSource source_;
  PeerLoads* peers_;
  const Clock* clock_;
  uint64_t incarnation_ = 0;
  // Whoever publishes holds it: the gossip thread, or one deciding a route (OwnStateChanged).
  std::mutex publish_mu_;
  uint64_t seq_ = 0;             // GUARDED_BY(publish_mu_)
  TimeNs last_publish_ = 0;      // GUARDED_BY(publish_mu_); the last attempt, sent or not
  TimeNs next_allowed_ = 0;      // GUARDED_BY(publish_mu_); the gap's end
  // Own counts changed since the last message read them; a wake-up of the gossip thread is
  // pending on wake_fd_ (an eventfd), so that a burst of changes writes it once.
  std::atomic<bool> changed_{false};
  std::atomic<bool> wake_pending_{false};
  int wake_fd_ = -1;
  std::string endpoint_;
  std::string router_id_;
  zmq::context_t ctx_{1};
  std::optional<CurveKeyPair> keys_;
  std::unique_ptr<ZapAuthenticator> zap_;
  std::unique_ptr<zmq::socket_t> pub_;
  std::unique_ptr<zmq::socket_t> sub_;
  // --peer-routers-dns: the watcher's newest answer, for the gossip thread to apply.
  std::unique_ptr<DnsWatcher> dns_;
  std::mutex dns_mu_;
  std::optional<std::vector<std::string>> dns_answer_;  // GUARDED_BY(dns_mu_)
  DnsMembership dns_peers_;                             // gossip thread only
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> sent_{0};
  std::atomic<uint64_t> applied_{0};
  RateLimit log_;
  prometheus::Family<prometheus::Counter>* refused_ = nullptr;
  prometheus::Counter* frames_sent_ = nullptr;
  prometheus::Counter* bytes_sent_ = nullptr;
  prometheus::Counter* frames_applied_ = nullptr;
  prometheus::Gauge* peers_gauge_ = nullptr;
};

Status Gossip::Impl::Init(prometheus::Registry* registry) {
  if (registry != nullptr) {
    refused_ = &prometheus::BuildCounter()
                    .Name("kvfleet_router_gossip_refused_total")
                    .Help("Gossip frames from peer routers refused, by reason")
                    .Register(*registry);
    for (const char* reason : kReasons) refused_->Add({{"reason", reason}});
    auto& frames = prometheus::BuildCounter()
                       .Name("kvfleet_router_gossip_frames_total")
                       .Help("Gossip frames this router sent, and those it applied from peers")
                       .Register(*registry);
    frames_sent_ = &frames.Add({{"direction", "sent"}});
    frames_applied_ = &frames.Add({{"direction", "applied"}});
    bytes_sent_ = &prometheus::BuildCounter()
                       .Name("kvfleet_router_gossip_sent_bytes_total")
                       .Help("Bytes of gossip frames this router sent (each to every subscriber)")
                       .Register(*registry)
                       .Add({});
    peers_gauge_ = &prometheus::BuildGauge()
                        .Name("kvfleet_router_gossip_peers")
                        .Help("Peer routers heard within the gossip ttl")
                        .Register(*registry)
                        .Add({});
  }
  if (!options_.keypair_file.empty()) {
    KVF_ASSIGN_OR_RETURN(CurveKeyPair keys, LoadCurveKeyPair(options_.keypair_file));
    keys_ = std::move(keys);
  } else if (!options_.insecure && !LocalOnlyEndpoint(options_.endpoint)) {
    return FailedPrecondition("gossip socket " + options_.endpoint +
                              " is reachable from other hosts but unauthenticated: anyone reaching it could read "
                              "this router's load. Give the fleet's gossip key pair (--gossip-keypair), bind a "
                              "loopback address, or pass --gossip-insecure on a network where every host is trusted");
  }
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return Internal("gossip: eventfd: " + std::string(strerror(errno)));
  StartZmqThreadsAtLowerPriority(ctx_);
  KVF_RETURN_IF_ERROR(Bind());
  router_id_ = options_.router_id.empty() ? DefaultRouterId(endpoint_) : options_.router_id;
  KVF_RETURN_IF_ERROR(ConnectPeers());
  thread_ = std::thread([this] { Loop(); });
  if (!options_.peers_dns.empty()) {
    dns_ = std::make_unique<DnsWatcher>(options_.peers_dns, options_.dns_interval, [this](std::vector<std::string> a) {
      std::lock_guard<std::mutex> lock(dns_mu_);
      dns_answer_ = std::move(a);
    });
  }
  return Status::Ok();
}

void Gossip::Impl::ApplyDnsAnswer() {
  std::optional<std::vector<std::string>> answer;
  {
    std::lock_guard<std::mutex> lock(dns_mu_);
    answer.swap(dns_answer_);
  }
  if (!answer) return;
  std::vector<std::string> joined, left;
  dns_peers_.Update(*answer, &joined, &left);
  for (const std::string& peer : left) {
    try {
      sub_->disconnect(peer);
    } catch (const zmq::error_t&) {  // never connected (a failed connect below): nothing to undo
    }
  }
  for (const std::string& peer : joined) {
    try {
      sub_->connect(peer);
    } catch (const zmq::error_t& e) {
      Logger("gossip")->warn("gossip: cannot connect to peer router {} (from {}): {}", peer, options_.peers_dns,
                             e.what());
    }
  }
  if (!joined.empty() || !left.empty()) {
    Logger("gossip")->info("gossip: {} lists {} routers ({} joined, {} left)", options_.peers_dns, answer->size(),
                           joined.size(), left.size());
  }
}

Status Gossip::Impl::Bind() {
  try {
    pub_ = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::pub);
    pub_->set(zmq::sockopt::linger, 0);
    pub_->set(zmq::sockopt::sndhwm, config::kGossipHighWaterMark);
    // A PUB reads only subscriptions; this channel's is the empty one.
    pub_->set(zmq::sockopt::maxmsgsize, wire::limits::kMaxSubscriptionBytes);
    if (keys_) {
      auto on_refused = [this](const std::string& key) {  // the ZAP thread
        Refuse("unauthenticated", "a subscriber without the fleet's gossip key (" +
                                      (key.empty() ? std::string("no CURVE") : key) + ")");
      };
      zap_ = std::make_unique<ZapAuthenticator>(&ctx_, std::set<std::string>{keys_->public_key}, on_refused);
      KVF_RETURN_IF_ERROR(zap_->status());
      pub_->set(zmq::sockopt::zap_domain, "kvfleet-gossip");
      KVF_RETURN_IF_ERROR(MakeCurveServer(*pub_, *keys_));
    }
    pub_->bind(options_.endpoint);
    endpoint_ = pub_->get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return Unavailable("cannot bind gossip socket " + options_.endpoint + ": " + e.what());
  }
  return Status::Ok();
}

Status Gossip::Impl::ConnectPeers() {
  try {
    sub_ = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::sub);
    sub_->set(zmq::sockopt::linger, 0);
    sub_->set(zmq::sockopt::rcvhwm, config::kGossipHighWaterMark);
    sub_->set(zmq::sockopt::maxmsgsize, wire::limits::kMaxGossipBytes);
    sub_->set(zmq::sockopt::subscribe, "");
    sub_->set(zmq::sockopt::ipv6, 1);  // a DNS name may answer IPv6 addresses
    if (keys_) KVF_RETURN_IF_ERROR(MakeCurveClient(*sub_, *keys_, keys_->public_key));
    for (const std::string& peer : options_.peers) {
      if (peer == options_.endpoint || peer == endpoint_) continue;
      sub_->connect(peer);
    }
  } catch (const zmq::error_t& e) {
    return InvalidArgument("cannot connect to peer routers: " + std::string(e.what()));
  }
  return Status::Ok();
}

void Gossip::Impl::Refuse(const char* reason, const std::string& why) {
  if (refused_ != nullptr) refused_->Add({{"reason", reason}}).Increment();
  uint64_t suppressed = 0;
  if (log_.Allow(&suppressed)) Logger("gossip")->warn("gossip: refused: {} ({} more suppressed)", why, suppressed);
}

bool Gossip::Impl::ChannelDown() {
  if (options_.faults == nullptr || !options_.faults->Down(clock_->Now())) return false;
  options_.faults->CountDropped();
  return true;
}

std::optional<TimeNs> Gossip::Impl::PublishWhenDue(TimeNs now, bool heartbeat) {
  std::lock_guard<std::mutex> lock(publish_mu_);
  if (pub_ == nullptr) return std::nullopt;
  if (heartbeat) {
    if (now - last_publish_ < options_.interval) return last_publish_ + options_.interval;
  } else if (now < next_allowed_) {
    return next_allowed_;
  }
  PublishLocked(now);
  return std::nullopt;
}

void Gossip::Impl::PublishLocked(TimeNs now) {
  // Cleared before the state is read: a change from here on is told by the next message.
  changed_.store(false);
  last_publish_ = now;
  next_allowed_ = now + options_.min_gap;
  if (ChannelDown()) return;
  RouterGossip g;
  g.router_id = router_id_;
  g.incarnation = incarnation_;
  g.seq = ++seq_;
  source_(&g);
  const std::string frame = EncodeGossip(g);
  const auto by_bytes = static_cast<DurationNs>(static_cast<double>(frame.size()) / config::kGossipBytesPerSecond *
                                                static_cast<double>(kNsPerSec));
  next_allowed_ = now + std::max(options_.min_gap, by_bytes);
  try {
    if (!pub_->send(zmq::buffer(frame), zmq::send_flags::dontwait)) return;
  } catch (const zmq::error_t&) {
    return;  // nothing to do but try again: the heartbeat
  }
  sent_.fetch_add(1);
  if (frames_sent_ != nullptr) frames_sent_->Increment();
  if (bytes_sent_ != nullptr) bytes_sent_->Increment(static_cast<double>(frame.size()));
}

void Gossip::Impl::OwnStateChanged(bool routed) {
  if (!options_.on_change || stopping_.load(std::memory_order_acquire)) return;
  changed_.store(true);
  if (routed) {
    // The peers hear of the decision before its worker does, when the gap allows. A thread
    // publishing already, or the gap, leaves it to the gossip thread.
    std::unique_lock<std::mutex> lock(publish_mu_, std::try_to_lock);
    const TimeNs now = clock_->Now();
    if (lock.owns_lock() && pub_ != nullptr && now >= next_allowed_) return PublishLocked(now);
  }
  if (!wake_pending_.exchange(true)) {
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
  }
}

void Gossip::Impl::Receive(const zmq::message_t& frame) {
  if (ChannelDown()) return;  // read and dropped: nothing queues for the outage's end
  Result<RouterGossip> g = DecodeGossip(frame.data(), frame.size());
  if (!g.ok()) {
    const bool malformed = g.status().code() == StatusCode::kDataLoss;
    Refuse(malformed ? "malformed" : "invalid", std::string(g.status().message()));
    return;
  }
  if (g->router_id == router_id_) {
    if (!options_.peers_dns.empty()) return;  // the DNS name lists this router too: heard, and passed over
    Refuse("self", "a frame naming this router (" + router_id_ +
                       "): its own endpoint under another address in --peer-routers?");
    return;
  }
  const GossipRefusal refusal = peers_->Apply(*g, clock_->Now());
  if (refusal != GossipRefusal::kNone) {
    Refuse(GossipRefusalName(refusal), "router '" + g->router_id + "': " + GossipRefusalName(refusal));
    return;
  }
  applied_.fetch_add(1);
  if (frames_applied_ != nullptr) frames_applied_->Increment();
}

void Gossip::Impl::Drain() {
  // Bounded, so a flood cannot keep this thread from publishing.
  for (int i = 0; i < 1024; ++i) {
    zmq::message_t frame;
    try {
      if (!sub_->recv(frame, zmq::recv_flags::dontwait)) return;
      if (!frame.more()) {
        Receive(frame);
        continue;
      }
      while (frame.more()) {  // a frame more than Contract 5 says: refuse the whole message
        if (!sub_->recv(frame, zmq::recv_flags::dontwait)) break;
      }
      Refuse("multipart", "a message of more than one frame");
    } catch (const zmq::error_t&) {
      return;
    }
  }
}

void Gossip::Impl::Loop() {
  LowerThisThreadPriority();
  TimeNs next_tick = clock_->Now();
  while (!stopping_.load(std::memory_order_acquire)) {
    TimeNs now = clock_->Now();
    if (now >= next_tick) {
      ApplyDnsAnswer();
      peers_->Expire(now);
      if (peers_gauge_ != nullptr) peers_gauge_->Set(static_cast<double>(peers_->Peers()));
      next_tick = now + options_.interval;
    }
    TimeNs wake_at = next_tick;
    if (const std::optional<TimeNs> due = PublishWhenDue(now, /*heartbeat=*/true)) wake_at = std::min(wake_at, *due);
    if (changed_.load()) {
      if (const std::optional<TimeNs> due = PublishWhenDue(now, /*heartbeat=*/false)) wake_at = std::min(wake_at, *due);
    }
    zmq::pollitem_t items[] = {{sub_->handle(), 0, ZMQ_POLLIN, 0}, {nullptr, wake_fd_, ZMQ_POLLIN, 0}};
    now = clock_->Now();
    // Rounded up: a gap's end is never polled for early, so this thread does not spin.
    const auto wait_ms = std::max<int64_t>(0, (wake_at - now + kNsPerMs - 1) / kNsPerMs);
    try {
      zmq::poll(items, 2, std::chrono::milliseconds(wait_ms));
    } catch (const zmq::error_t&) {
      continue;
    }
    if ((items[1].revents & ZMQ_POLLIN) != 0) {
      uint64_t count = 0;
      (void)!::read(wake_fd_, &count, sizeof(count));
      wake_pending_.store(false);  // then changed_ is read again at the top: none is missed
    }
    if ((items[0].revents & ZMQ_POLLIN) != 0) Drain();
  }
}

void Gossip::Impl::Stop() {
  dns_.reset();  // joins the resolver, which writes dns_answer_
  stopping_.store(true, std::memory_order_release);
  if (thread_.joinable()) thread_.join();
  sub_.reset();
  {
    std::lock_guard<std::mutex> lock(publish_mu_);  // a deciding thread may be publishing
    pub_.reset();
  }
  zap_.reset();
}

Result<std::unique_ptr<Gossip>> Gossip::Start(const GossipOptions& options, GossipSource source, PeerLoads* peers,
                                              const Clock* clock, prometheus::Registry* registry) {
  auto impl = std::make_unique<Impl>(options, std::move(source), peers, clock);
  KVF_RETURN_IF_ERROR(impl->Init(registry));
  return std::unique_ptr<Gossip>(new Gossip(std::move(impl)));
}

Gossip::Gossip(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gossip::~Gossip() { Stop(); }
void Gossip::Stop() { impl_->Stop(); }
const std::string& Gossip::endpoint() const { return impl_->endpoint(); }
const std::string& Gossip::router_id() const { return impl_->router_id(); }
uint64_t Gossip::sent() const { return impl_->sent(); }
uint64_t Gossip::applied() const { return impl_->applied(); }
void Gossip::OwnStateChanged(bool routed) { impl_->OwnStateChanged(routed); }

}  // namespace kvfleet::router
