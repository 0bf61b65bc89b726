// The server's listener and I/O threads: one io_context per thread, connections accepted
// round robin onto them, fd watches for the handler layer (IoThread), and the route
// table. A connection's reading and writing, and Exchange, are in connection.cc.
#include "common/http/server.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/status.hpp>
#include <nlohmann/json.hpp>

#include "common/http/connection.h"
#include "common/http/server_metrics.h"
#include "common/log.h"

namespace kvfleet::http {

namespace config {
// The first wait after a failed accept, doubled on each failure in a row up to the second:
// a few tries while a burst of connections frees its descriptors, then one a second.
constexpr std::chrono::milliseconds kAcceptBackoffFirst{10};
constexpr std::chrono::milliseconds kAcceptBackoffMax{1000};
}  // namespace config

namespace {

std::string DefaultErrorBody(int status, std::string_view message) {
  nlohmann::json j;
  j["error"] = {{"message", message}, {"code", status}};
  return j.dump();
}

// The IoThread of one io_context (one I/O thread).
class IoThreadImpl final : public IoThread {
 public:
  explicit IoThreadImpl(net::io_context& ioc) : ioc_(ioc) {}

  void Post(std::function<void()> fn) override { net::post(ioc_, std::move(fn)); }
  std::unique_ptr<Watch> WatchReadable(int fd, std::function<void()> on_readable) override;
  void* attachment() const override { return attachment_.get(); }
  void set_attachment(std::shared_ptr<void> object) override { attachment_ = std::move(object); }

 private:
  net::io_context& ioc_;
  std::shared_ptr<void> attachment_;
};

// An fd watched with async_wait. Asio registers descriptors edge-triggered, but each
// async_wait re-arms with EPOLL_CTL_MOD, which reports an fd that is readable now: an fd
// drained by the callback is not reported again, one still readable is.
class FdWatch final : public IoThread::Watch {
 public:
  FdWatch(net::io_context& ioc, int fd, std::function<void()> on_readable)
      : state_(std::make_shared<State>(ioc, fd, std::move(on_readable))) {
    Arm(state_);
  }
  ~FdWatch() override {
    // Deregistered now, not when the aborted wait lets go of the state: by then the fd may
    // be closed and its number reused by a newer watch, whose registration it would drop.
    state_->live = false;
    (void)state_->descriptor.release();
  }

 private:
  struct State {
    State(net::io_context& ioc, int fd, std::function<void()> cb) : descriptor(ioc, fd), on_readable(std::move(cb)) {}
    ~State() {
      if (descriptor.is_open()) (void)descriptor.release();  // the fd is the caller's
    }
    net::posix::stream_descriptor descriptor;
    std::function<void()> on_readable;
    bool live = true;
  };

  static void Arm(std::shared_ptr<State> state) {
    State* s = state.get();
    s->descriptor.async_wait(net::posix::descriptor_base::wait_read,
                             [state = std::move(state)](beast::error_code ec) mutable {
                               if (ec || !state->live) return;
                               state->on_readable();  // may destroy the watch (live = false)
                               if (state->live) Arm(std::move(state));
                             });
  }

  std::shared_ptr<State> state_;
};

std::unique_ptr<IoThread::Watch> IoThreadImpl::WatchReadable(int fd, std::function<void()> on_readable) {
  return std::make_unique<FdWatch>(ioc_, fd, std::move(on_readable));
}

}  // namespace

std::string_view Request::Header(std::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (beast::iequals(n, name)) return v;
  }
  return {};
}

std::string_view ReasonPhrase(int status) {
  auto sv = bhttp::obsolete_reason(static_cast<bhttp::status>(status));
  return {sv.data(), sv.size()};
}

// --- Routes ---

void Routes::Add(std::string method, std::string path, Handler handler) {
  routes_.push_back({std::move(method), std::move(path), std::move(handler)});
}

void Routes::AddSync(std::string method, std::string path, std::function<Response(const Request&)> handler) {
  Add(std::move(method), std::move(path), [handler = std::move(handler)](std::shared_ptr<Exchange> ex) {
    ex->Reply(handler(ex->request()));
  });
}

void Routes::SetErrorFormatter(std::function<Response(int, std::string_view)> formatter) {
  error_formatter_ = std::move(formatter);
}

void Routes::OnThreadStart(std::function<void(IoThread*)> init) { thread_start_ = std::move(init); }

const Handler* Routes::Find(std::string_view method, std::string_view path, int* status) const {
  *status = 404;
  for (const Route& r : routes_) {
    if (r.path != path) continue;
    if (r.method == method) return &r.handler;
    *status = 405;
  }
  return nullptr;
}

Response Routes::FormatError(int status, std::string_view message) const {
  if (error_formatter_) return error_formatter_(status, message);
  Response r;
  r.status = status;
  r.body = DefaultErrorBody(status, message);
  return r;
}

// --- Server ---

class ServerImpl {
 public:
  ServerImpl(const ServerOptions& options, Routes routes, std::shared_ptr<prometheus::Registry> registry)
      : options_(options), routes_(std::move(routes)),
        metrics_(std::make_shared<ServerMetrics>(std::move(registry))), iocs_(MakeContexts(options.io_threads)),
        acceptor_(net::make_strand(*iocs_[0])), accept_timer_(acceptor_.get_executor()) {
    for (auto& ioc : iocs_) {
      io_threads_.push_back(std::make_unique<IoThreadImpl>(*ioc));
      // A context's reactor (an epoll and an eventfd descriptor) is made with its first
      // socket. Made now, not by the first accept onto the context, which would throw when
      // that accept comes with no descriptor left.
      tcp::socket reactor_now(*ioc);
    }
  }

  Status Listen() {
    beast::error_code ec;
    auto address = net::ip::make_address(options_.address, ec);
    if (ec) return InvalidArgument("bad listen address '" + options_.address + "': " + ec.message());
    tcp::endpoint endpoint(address, options_.port);
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
    if (ec) {
      return Unavailable("cannot listen on " + options_.address + ":" + std::to_string(options_.port) + ": " +
                         ec.message());
    }
    port_ = acceptor_.local_endpoint().port();
    return Status::Ok();
  }

  void Run() {
    if (const auto& init = routes_.thread_start()) {
      // Queued before the acceptor starts: it runs ahead of any connection's handlers.
      for (auto& t : io_threads_) t->Post([init, thread = t.get()] { init(thread); });
    }
    Accept();
    for (auto& ioc : iocs_) {
      guards_.push_back(net::make_work_guard(*ioc));  // a context with no connection yet keeps running
      threads_.emplace_back([ioc = ioc.get()] { ioc->run(); });
    }
  }

  void Stop() {
    if (stopped_.exchange(true)) return;
    net::post(acceptor_.get_executor(), [this] {
      beast::error_code ec;
      acceptor_.close(ec);
      accept_timer_.cancel();
    });
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& weak : connections_) {
        if (auto c = weak.lock()) c->PostClose();
      }
      connections_.clear();
    }
    // Let the closes run, then stop the loop; queued work is dropped with the context.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (auto& g : guards_) g.reset();
    for (auto& ioc : iocs_) ioc->stop();
    for (auto& t : threads_) t.join();
    threads_.clear();
    // Attachments go while their threads' io_contexts (and the watches' descriptors) live.
    for (auto& t : io_threads_) t->set_attachment(nullptr);
  }

  uint16_t port() const { return port_; }

 private:
  void Accept() {
    size_t index = next_context_++ % iocs_.size();
    net::io_context& ioc = *iocs_[index];
    IoThread* io_thread = io_threads_[index].get();
    acceptor_.async_accept(net::make_strand(ioc), [this, io_thread](beast::error_code ec, tcp::socket socket) {
      if (ec == net::error::operation_aborted || stopped_) return;
      if (ec) return OnAcceptError(ec);
      accept_backoff_ = config::kAcceptBackoffFirst;
      Admit(std::move(socket), io_thread);
      Accept();
    });
  }

  // Out of descriptors (EMFILE, ENFILE) or memory (ENOBUFS, ENOMEM), the listener stays
  // readable and an accept at once fails again: wait, doubling the wait up to a bound, so the
  // pending clients are served soon after the condition clears without a busy loop before.
  void OnAcceptError(const beast::error_code& ec) {
    metrics_->CountAcceptError(ec);
    uint64_t skipped = 0;
    if (accept_log_.Allow(&skipped)) {
      Logger("http")->warn("accept failed: {}; next accept in {} ms ({} more failures since the last report)",
                           ec.message(), accept_backoff_.count(), skipped);
    }
    accept_timer_.expires_after(accept_backoff_);
    accept_timer_.async_wait([this](beast::error_code wait_ec) {
      if (!wait_ec && !stopped_) Accept();
    });
    accept_backoff_ = std::min(accept_backoff_ * 2, config::kAcceptBackoffMax);
  }

  // Serves an accepted connection, or closes it at once when max_connections are open: a
  // client sees its connection refused rather than waiting in a backlog of unknown length.
  void Admit(tcp::socket socket, IoThread* io_thread) {
    if (!metrics_->TryOpen(options_.max_connections)) {
      uint64_t skipped = 0;
      if (refuse_log_.Allow(&skipped)) {
        Logger("http")->warn("closing a new connection: {} are open, the most allowed ({} more closed since the last "
                             "report)",
                             options_.max_connections, skipped);
      }
      beast::error_code ignored;
      socket.close(ignored);
      return;
    }
    auto connection = std::make_shared<Connection>(std::move(socket), options_, &routes_, io_thread, metrics_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Drop the entries of closed connections now and then, so the list stays small.
      if (connections_.size() > 64 && connections_.size() % 64 == 0) {
        std::erase_if(connections_, [](const auto& w) { return w.expired(); });
      }
      connections_.push_back(connection);
    }
    connection->Start();
  }

  // One io_context per I/O thread, each connection pinned to one of them (round robin at
  // accept). With one context shared by every thread, each post to a connection (every SSE
  // chunk the router writes) woke the other threads too: ~14 context switches per thread
  // per request at 200 req/s, most of the router's CPU on a 2-core machine.
  static std::vector<std::unique_ptr<net::io_context>> MakeContexts(int threads) {
    std::vector<std::unique_ptr<net::io_context>> out;
    for (int i = 0; i < std::max(1, threads); ++i) out.push_back(std::make_unique<net::io_context>(1));
    return out;
  }

  ServerOptions options_;
  Routes routes_;
  std::shared_ptr<ServerMetrics> metrics_;  // shared with the connections, which may outlive this
  std::vector<std::unique_ptr<net::io_context>> iocs_;
  std::vector<std::unique_ptr<IoThreadImpl>> io_threads_;  // parallel to iocs_
  std::vector<net::executor_work_guard<net::io_context::executor_type>> guards_;
  size_t next_context_ = 0;  // the acceptor's strand only
  tcp::acceptor acceptor_;
  net::steady_timer accept_timer_;  // the acceptor's strand only, as is accept_backoff_
  std::chrono::milliseconds accept_backoff_ = config::kAcceptBackoffFirst;
  RateLimit accept_log_{config::kLogIntervalMs};
  RateLimit refuse_log_{config::kLogIntervalMs};
  std::vector<std::thread> threads_;
  uint16_t port_ = 0;
  std::atomic<bool> stopped_{false};
  std::mutex mu_;
  std::vector<std::weak_ptr<Connection>> connections_;  // GUARDED_BY(mu_)
};

Server::Server(std::unique_ptr<ServerImpl> impl) : impl_(std::move(impl)) {}
Server::~Server() { Stop(); }

Result<std::unique_ptr<Server>> Server::Start(const ServerOptions& options, Routes routes,
                                              std::shared_ptr<prometheus::Registry> registry) {
  if (options.max_header_bytes == 0 || options.max_body_bytes == 0 || options.max_connections == 0) {
    return InvalidArgument("http limits must be positive");
  }
  auto impl = std::make_unique<ServerImpl>(options, std::move(routes), std::move(registry));
  KVF_RETURN_IF_ERROR(impl->Listen());
  impl->Run();
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

uint16_t Server::port() const { return impl_->port(); }
void Server::Stop() { impl_->Stop(); }

}  // namespace kvfleet::http
