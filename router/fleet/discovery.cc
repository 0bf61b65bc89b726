#include "router/fleet/discovery.h"

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "router/fleet/membership.h"
#include "schema/limits.h"

namespace kvfleet::router {

namespace {

// "tcp://host:5556" -> ("tcp://host", 5556); nullopt when there is no numeric port.
std::optional<std::pair<std::string, int>> SplitPort(const std::string& endpoint) {
  size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon + 1 >= endpoint.size()) return std::nullopt;
  try {
    return std::make_pair(endpoint.substr(0, colon), std::stoi(endpoint.substr(colon + 1)));
  } catch (...) {
    return std::nullopt;
  }
}

// `endpoint` ("scheme://host:port") with its host replaced by `host`; unchanged when it has
// no port.
std::string WithHost(const std::string& endpoint, const std::string& host) {
  auto hp = SplitPort(endpoint);
  if (!hp) return endpoint;
  size_t scheme = hp->first.find("://");
  std::string prefix = scheme == std::string::npos ? "tcp://" : hp->first.substr(0, scheme + 3);
  return prefix + host + ":" + std::to_string(hp->second);
}

}  // namespace

WorkerHello DescribedHello(const WorkerHello& listed, WorkerHello answer) {
  answer.requests_endpoint = listed.requests_endpoint;
  auto hp = SplitPort(listed.requests_endpoint);
  if (!hp) return answer;
  size_t scheme = hp->first.find("://");
  const std::string host = scheme == std::string::npos ? hp->first : hp->first.substr(scheme + 3);
  for (std::string* ep : {&answer.events_endpoint, &answer.replay_endpoint, &answer.http_endpoint}) {
    if (!ep->empty()) *ep = WithHost(*ep, host);
  }
  return answer;
}

WorkerHello StaticHello(const std::string& requests, const StaticFleet& fleet) {
  WorkerHello h;
  h.name = requests;
  h.model = fleet.model;
  h.block_size = fleet.block_size;
  h.max_context = fleet.max_context;
  h.requests_endpoint = requests;
  if (auto hp = SplitPort(requests)) {
    h.events_endpoint = hp->first + ":" + std::to_string(hp->second + 1);
    h.replay_endpoint = hp->first + ":" + std::to_string(hp->second + 2);
  }
  h.backend = "static";
  return h;
}

std::vector<std::string> Resolve(const std::string& host_port) {
  std::vector<std::string> out;
  size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) return out;
  std::string host = host_port.substr(0, colon), port = host_port.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0) return out;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    char buf[NI_MAXHOST];
    if (getnameinfo(a->ai_addr, a->ai_addrlen, buf, sizeof(buf), nullptr, 0, NI_NUMERICHOST) != 0) continue;
    std::string addr = buf;
    if (a->ai_family == AF_INET6) addr = "[" + addr + "]";
    out.push_back("tcp://" + addr + ":" + port);
  }
  freeaddrinfo(res);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

DnsWatcher::DnsWatcher(std::string host_port, DurationNs interval,
                       std::function<void(std::vector<std::string>)> on_answer)
    : host_port_(std::move(host_port)), interval_(interval), on_answer_(std::move(on_answer)) {
  thread_ = std::thread([this] { Loop(); });
}

DnsWatcher::~DnsWatcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void DnsWatcher::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    lock.unlock();
    std::vector<std::string> endpoints = Resolve(host_port_);
    if (endpoints.empty()) Logger("fleet")->warn("DNS name {} resolved to no address", host_port_);
    on_answer_(std::move(endpoints));
    lock.lock();
    cv_.wait_for(lock, std::chrono::nanoseconds(interval_), [&] { return stopping_; });
  }
}

void DnsMembership::Update(const std::vector<std::string>& answer, std::vector<std::string>* joined,
                           std::vector<std::string>* left) {
  std::set<std::string> now(answer.begin(), answer.end());
  for (const auto& ep : answer) {
    if (known_.insert(ep).second) joined->push_back(ep);
  }
  for (auto it = known_.begin(); it != known_.end();) {
    if (now.count(*it)) {
      ++it;
      continue;
    }
    left->push_back(*it);
    it = known_.erase(it);
  }
}

bool LocalOnlyEndpoint(const std::string& endpoint) {
  if (endpoint.starts_with("ipc://") || endpoint.starts_with("inproc://")) return true;
  if (!endpoint.starts_with("tcp://")) return false;
  const std::string host = endpoint.substr(6, endpoint.rfind(':') - 6);
  return host == "localhost" || host == "[::1]" || host == "::1" || host.starts_with("127.");
}

Status Registration::Bind(zmq::context_t& ctx, const std::string& endpoint, const std::optional<RegistrationKeys>& keys,
                          bool insecure, std::function<void(const std::string&)> on_refused) {
  if (!keys && !insecure && !LocalOnlyEndpoint(endpoint)) {
    return FailedPrecondition("registration socket " + endpoint +
                              " is reachable from other hosts but unauthenticated: anyone reaching it could register "
                              "a worker and receive its traffic. Give the workers' public keys "
                              "(--registration-authorized-keys, with --curve-keypair), bind a loopback address, or "
                              "pass --registration-insecure on a network where every host is trusted");
  }
  try {
    socket_ = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::router);
    socket_->set(zmq::sockopt::linger, 0);
    socket_->set(zmq::sockopt::maxmsgsize, wire::limits::kMaxHelloBytes);
    // A worker's routing id is its worker id; its newest connection (a restart, a reconnect
    // after a network fault) takes the id over rather than being ignored behind a stale one.
    socket_->set(zmq::sockopt::router_handover, 1);
    if (keys) {
      zap_ = std::make_unique<ZapAuthenticator>(&ctx, keys->authorized, std::move(on_refused));
      KVF_RETURN_IF_ERROR(zap_->status());
      socket_->set(zmq::sockopt::zap_domain, "kvfleet-registration");
      KVF_RETURN_IF_ERROR(MakeCurveServer(*socket_, keys->server));
    }
    socket_->bind(endpoint);
    endpoint_ = socket_->get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return Unavailable("cannot bind registration socket " + endpoint + ": " + e.what());
  }
  return Status::Ok();
}

void Registration::Drain(const std::function<void(const ToRouterMessage&, const RegistrationPeer&)>& on_message) {
  for (int i = 0; i < 256; ++i) {
    zmq::message_t identity, body;
    if (!socket_->recv(identity, zmq::recv_flags::dontwait)) return;
    if (!identity.more() || !socket_->recv(body, zmq::recv_flags::dontwait)) continue;
    while (body.more()) {  // a frame more than Contract 3 says: skip the rest
      zmq::message_t extra;
      if (!socket_->recv(extra, zmq::recv_flags::dontwait)) break;
      if (!extra.more()) break;
    }
    auto decoded = DecodeToRouter(body.data(), body.size());
    if (!decoded.ok()) {
      uint64_t suppressed = 0;
      if (bad_frames_.Allow(&suppressed)) {
        Logger("fleet")->warn("registration: {} ({} more suppressed)", decoded.status().message(), suppressed);
      }
      continue;
    }
    RegistrationPeer peer;
    if (zap_ != nullptr) {
      const char* key = body.gets("User-Id");  // set by the ZapAuthenticator: the client's key
      peer.identity = key != nullptr ? key : "";
      peer.authenticated = !peer.identity.empty();
    } else {
      peer.identity = PeerOfRoutingId(identity.to_string_view());
    }
    on_message(*decoded, peer);
  }
}

}  // namespace kvfleet::router
