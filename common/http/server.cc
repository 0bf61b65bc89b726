#include "common/http/server.h"

#include <cstdio>
#include <deque>
#include <optional>
#include <thread>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>
#include <nlohmann/json.hpp>

#include "common/log.h"

namespace kvfleet::http {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Parser = bhttp::request_parser<bhttp::string_body>;

namespace {

// A watch read (see Connection) stops reading ahead once this much unparsed input is
// buffered; a client that pipelines more than this waits for its earlier responses.
constexpr size_t kMaxReadAhead = 64 * 1024;
constexpr size_t kWatchReadBytes = 4096;
// A connection's read buffer starts this large: Beast reads as much as the buffer has room
// for (512 bytes into an empty one), so a request of up to 16 KiB (an 8K-token prompt of
// token-sized words) arrives in one read rather than one per doubling of the buffer. Kept
// small because every open connection holds it.
constexpr size_t kInitialReadBuffer = 16 * 1024;

void ConfigureParser(Parser& parser, const ServerOptions& options) {
  parser.header_limit(static_cast<uint32_t>(options.max_header_bytes));
  parser.body_limit(options.max_body_bytes);
}

// The HTTP status to answer for a parse error, or 0 when the connection just ends.
int StatusForReadError(const beast::error_code& ec) {
  if (ec == bhttp::error::body_limit) return 413;
  if (ec == bhttp::error::header_limit) return 431;
  if (ec.category() == beast::error_code(bhttp::error::end_of_stream).category() && ec != bhttp::error::end_of_stream &&
      ec != bhttp::error::partial_message) {
    return 400;
  }
  return 0;
}

Request FromParsed(bhttp::request<bhttp::string_body>&& msg) {
  Request r;
  r.method = std::string(msg.method_string());
  r.target = std::string(msg.target());
  size_t q = r.target.find('?');
  r.path = q == std::string::npos ? r.target : r.target.substr(0, q);
  r.keep_alive = msg.keep_alive();
  r.headers.reserve(8);
  for (const auto& field : msg) {
    r.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  }
  r.body = std::move(msg.body());
  return r;
}

std::string DefaultErrorBody(int status, std::string_view message) {
  nlohmann::json j;
  j["error"] = {{"message", message}, {"code", status}};
  return j.dump();
}

// The status line and headers of a response. content_length < 0: chunked.
std::string FormatHead(int status, std::string_view content_type, const Headers& headers, int64_t content_length,
                       bool keep_alive) {
  std::string head;
  head.reserve(256);
  head += "HTTP/1.1 ";
  head += std::to_string(status);
  head += ' ';
  head += ReasonPhrase(status);
  head += "\r\nServer: kvfleet\r\n";
  if (!content_type.empty()) {
    head += "Content-Type: ";
    head += content_type;
    head += "\r\n";
  }
  for (const auto& [name, value] : headers) {
    head += name;
    head += ": ";
    head += value;
    head += "\r\n";
  }
  if (content_length >= 0) {
    head += "Content-Length: ";
    head += std::to_string(content_length);
    head += "\r\n";
  } else {
    head += "Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\n";
  }
  if (!keep_alive) head += "Connection: close\r\n";
  head += "\r\n";
  return head;
}

std::string FormatWhole(const Response& r, bool keep_alive) {
  std::string out = FormatHead(r.status, r.content_type, r.headers, static_cast<int64_t>(r.body.size()), keep_alive);
  out += r.body;
  return out;
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

// One client connection. Every member is touched only on the connection's strand.
//
// Reading: a request is read (header, then body after "100 Continue" when asked). While
// its response is in progress a small "watch" read stays armed: it completes with an
// error when the client goes away (the Exchange is told) and otherwise reads ahead the
// next pipelined request into the same buffer. When the response completes the watch
// read is cancelled and the next request is parsed from the buffer.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, const ServerOptions& options, const Routes* routes, IoThread* io_thread)
      : stream_(std::move(socket)), options_(options), routes_(routes), io_thread_(io_thread) {}

  void Start() {
    buffer_.reserve(kInitialReadBuffer);
    beast::error_code ec;
    stream_.socket().set_option(tcp::no_delay(true), ec);  // SSE chunks are small: send at once
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->ReadRequest(); });
  }

  // Any thread: queue bytes of the current response. `last`: the response is complete
  // after them; `close`: close the connection once they are sent.
  //
  // Pieces delivered back to back (a stream's head and first chunk; the last chunk, usage
  // and [DONE]) leave in one write: one send and one client wake-up instead of several.
  // A piece is held only while another Deliver is already posted behind it.
  void Deliver(std::string bytes, bool last, bool close) {
    pending_delivers_.fetch_add(1, std::memory_order_relaxed);
    net::post(stream_.get_executor(), [self = shared_from_this(), bytes = std::move(bytes), last, close]() mutable {
      const bool more = self->pending_delivers_.fetch_sub(1, std::memory_order_relaxed) > 1;
      if (self->closed_ || !self->responding_ || self->response_done_) {
        if (!more) self->Flush();
        return;
      }
      if (close) self->close_after_ = true;
      if (last) self->response_done_ = true;
      self->Queue(std::move(bytes), /*write_now=*/!more);
    });
  }

  void PostClose() {
    net::post(stream_.get_executor(), [self = shared_from_this()] { self->Close(); });
  }

  const Routes& routes() const { return *routes_; }
  IoThread* io_thread() const { return io_thread_; }

 private:
  void ReadRequest() {
    if (closed_) return;
    parser_.emplace();
    ConfigureParser(*parser_, options_);
    stream_.expires_after(std::chrono::milliseconds(buffer_.size() > 0 ? options_.read_timeout_ms
                                                                         : options_.idle_timeout_ms));
    reading_ = true;
    bhttp::async_read_header(stream_, buffer_, *parser_,
                             [self = shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
  }

  void OnHeader(beast::error_code ec) {
    reading_ = false;
    if (ec) return OnReadError(ec);
    stream_.expires_after(std::chrono::milliseconds(options_.read_timeout_ms));
    if (beast::iequals(parser_->get()[bhttp::field::expect], "100-continue")) {
      Queue("HTTP/1.1 100 Continue\r\n\r\n");
    }
    if (parser_->is_done()) return OnRequest();
    reading_ = true;
    bhttp::async_read(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      self->reading_ = false;
      if (ec) return self->OnReadError(ec);
      self->OnRequest();
    });
  }

  void OnReadError(beast::error_code ec) {
    int status = StatusForReadError(ec);
    if (status == 0 || closed_) return Close();
    // Answer the error and close: the rest of the stream cannot be trusted.
    responding_ = true;
    response_done_ = true;
    close_after_ = true;
    stream_.expires_after(std::chrono::milliseconds(options_.read_timeout_ms));
    Response r = routes_->FormatError(status, ec.message());
    Queue(FormatWhole(r, false));
  }

  void OnRequest() {
    stream_.expires_never();  // a response may take as long as generation does
    Request request = FromParsed(parser_->release());
    parser_.reset();
    bool keep_alive = request.keep_alive;
    responding_ = true;
    response_done_ = false;
    close_after_ = !keep_alive;
    StartWatch();
    int status = 0;
    const Handler* handler = routes_->Find(request.method, request.path, &status);
    std::string path = request.path;
    auto exchange = std::make_shared<Exchange>(shared_from_this(), std::move(request));
    exchange_ = exchange;
    if (handler == nullptr) {
      exchange->Reply(routes_->FormatError(status, status == 404 ? "no such path" : "method not allowed"));
      return;
    }
    try {
      (*handler)(std::move(exchange));
    } catch (const std::exception& e) {
      // Nothing throws across this boundary: a handler bug becomes a 500 (the Exchange,
      // if dropped without a response, answers it).
      Logger("http")->error("handler for {} threw: {}", path, e.what());
    }
  }

  void StartWatch() {
    if (reading_ || closed_ || buffer_.size() >= kMaxReadAhead) return;
    reading_ = true;
    stream_.async_read_some(buffer_.prepare(kWatchReadBytes),
                            [self = shared_from_this()](beast::error_code ec, size_t n) { self->OnWatch(ec, n); });
  }

  void OnWatch(beast::error_code ec, size_t n) {
    reading_ = false;
    if (ec == net::error::operation_aborted && !responding_ && !closed_) return ReadRequest();
    if (ec) return Close();
    buffer_.commit(n);
    if (responding_) return StartWatch();
    ReadRequest();
  }

  void Queue(std::string bytes, bool write_now = true) {
    if (closed_) return;
    pending_bytes_ += bytes.size();
    if (pending_bytes_ > options_.max_pending_write_bytes) {
      Logger("http")->warn("closing a connection whose client reads too slowly ({} bytes unsent)", pending_bytes_);
      return Close();
    }
    out_.push_back(std::move(bytes));
    if (write_now) Flush();
  }

  void Flush() {
    if (!writing_ && !out_.empty() && !closed_) DoWrite();
  }

  void DoWrite() {
    // Gather everything queued into one write.
    inflight_.clear();
    for (auto& s : out_) inflight_ += s;
    out_.clear();
    writing_ = true;
    net::async_write(stream_, net::buffer(inflight_), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->OnWrite(ec, n);
    });
  }

  void OnWrite(beast::error_code ec, size_t n) {
    writing_ = false;
    if (ec) return Close();
    pending_bytes_ -= n;
    if (!out_.empty()) return DoWrite();
    if (responding_ && response_done_) OnResponseComplete();
  }

  void OnResponseComplete() {
    responding_ = false;
    response_done_ = false;
    exchange_.reset();
    if (close_after_) {
      beast::error_code ec;
      stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
      return Close();
    }
    if (reading_) {
      // The watch read: cancelling it continues in OnWatch, which reads the next request.
      beast::error_code ec;
      stream_.socket().cancel(ec);
      return;
    }
    ReadRequest();
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    if (responding_ && !response_done_) {
      if (auto exchange = exchange_.lock()) exchange->MarkClientGone();
    }
    exchange_.reset();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

  beast::tcp_stream stream_;
  const ServerOptions& options_;
  const Routes* routes_;
  IoThread* io_thread_;
  beast::flat_buffer buffer_;
  std::optional<Parser> parser_;
  std::weak_ptr<Exchange> exchange_;
  std::deque<std::string> out_;
  std::string inflight_;
  size_t pending_bytes_ = 0;
  bool reading_ = false;        // a read (request or watch) is outstanding
  bool writing_ = false;
  std::atomic<int> pending_delivers_{0};  // Deliver()s posted and not yet run (any thread)
  bool responding_ = false;     // a request was read and its response is not yet sent
  bool response_done_ = false;  // the response's last bytes are queued
  bool close_after_ = false;
  bool closed_ = false;
};

// --- Exchange ---

Exchange::Exchange(std::shared_ptr<Connection> connection, Request request)
    : connection_(std::move(connection)), request_(std::move(request)) {}

IoThread* Exchange::io_thread() const { return connection_->io_thread(); }

Exchange::~Exchange() {
  if (!started_.load()) {
    Logger("http")->error("no response to {} {}: answering 500", request_.method, request_.path);
    Reply(connection_->routes().FormatError(500, "internal error: the request was dropped"));
  } else if (!finished_.load()) {
    connection_->Deliver("0\r\n\r\n", /*last=*/true, /*close=*/true);
  }
}

void Exchange::Reply(Response response) {
  if (started_.exchange(true)) return;
  finished_.store(true);
  connection_->Deliver(FormatWhole(response, request_.keep_alive), /*last=*/true, !request_.keep_alive);
}

void Exchange::StartStream(int status, std::string_view content_type, Headers headers) {
  if (started_.exchange(true)) return;
  connection_->Deliver(FormatHead(status, content_type, headers, -1, request_.keep_alive), false, false);
}

bool Exchange::Write(std::string_view data) {
  if (gone_.load(std::memory_order_acquire)) return false;
  if (!started_.load() || finished_.load()) return false;
  if (data.empty()) return true;  // an empty chunk would end the stream
  char size[24];
  int len = std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
  std::string chunk;
  chunk.reserve(static_cast<size_t>(len) + data.size() + 2);
  chunk.append(size, static_cast<size_t>(len));
  chunk.append(data);
  chunk += "\r\n";
  connection_->Deliver(std::move(chunk), false, false);
  return true;
}

void Exchange::Finish() {
  if (!started_.load() || finished_.exchange(true)) return;
  connection_->Deliver("0\r\n\r\n", /*last=*/true, !request_.keep_alive);
}

void Exchange::OnClientGone(std::function<void()> callback) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!gone_.load()) {
      on_gone_ = std::move(callback);
      return;
    }
  }
  callback();
}

void Exchange::MarkClientGone() {
  std::function<void()> callback;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (gone_.exchange(true)) return;
    callback = std::move(on_gone_);
  }
  if (callback) callback();
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
  ServerImpl(const ServerOptions& options, Routes routes)
      : options_(options), routes_(std::move(routes)), iocs_(MakeContexts(options.io_threads)),
        acceptor_(net::make_strand(*iocs_[0])) {
    for (auto& ioc : iocs_) io_threads_.push_back(std::make_unique<IoThreadImpl>(*ioc));
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
      if (ec) {
        if (ec == net::error::operation_aborted || stopped_) return;
        Logger("http")->warn("accept failed: {}", ec.message());
      } else {
        auto connection = std::make_shared<Connection>(std::move(socket), options_, &routes_, io_thread);
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
      if (!stopped_) Accept();
    });
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
  std::vector<std::unique_ptr<net::io_context>> iocs_;
  std::vector<std::unique_ptr<IoThreadImpl>> io_threads_;  // parallel to iocs_
  std::vector<net::executor_work_guard<net::io_context::executor_type>> guards_;
  size_t next_context_ = 0;  // the acceptor's strand only
  tcp::acceptor acceptor_;
  std::vector<std::thread> threads_;
  uint16_t port_ = 0;
  std::atomic<bool> stopped_{false};
  std::mutex mu_;
  std::vector<std::weak_ptr<Connection>> connections_;  // GUARDED_BY(mu_)
};

Server::Server(std::unique_ptr<ServerImpl> impl) : impl_(std::move(impl)) {}
Server::~Server() { Stop(); }

Result<std::unique_ptr<Server>> Server::Start(const ServerOptions& options, Routes routes) {
  if (options.max_header_bytes == 0 || options.max_body_bytes == 0) {
    return InvalidArgument("http limits must be positive");
  }
  auto impl = std::make_unique<ServerImpl>(options, std::move(routes));
  KVF_RETURN_IF_ERROR(impl->Listen());
  impl->Run();
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

uint16_t Server::port() const { return impl_->port(); }
void Server::Stop() { impl_->Stop(); }

Result<Request> ParseRequest(std::string_view bytes, const ServerOptions& limits) {
  Parser parser;
  ConfigureParser(parser, limits);
  parser.eager(true);
  beast::error_code ec;
  net::const_buffer buffer(bytes.data(), bytes.size());
  while (!parser.is_done()) {
    if (buffer.size() == 0) return InvalidArgument("400: incomplete request");
    size_t used = parser.put(buffer, ec);
    buffer += used;
    if (ec == bhttp::error::need_more) {
      ec = {};
      if (used == 0) return InvalidArgument("400: incomplete request");
      continue;
    }
    if (ec) {
      int status = StatusForReadError(ec);
      return InvalidArgument(std::to_string(status == 0 ? 400 : status) + ": " + ec.message());
    }
    // Regression (found by router_http_fuzzer): a put that consumes nothing without an
    // error must not spin.
    if (used == 0) return InvalidArgument("400: the parser made no progress");
  }
  return FromParsed(parser.release());
}

}  // namespace kvfleet::http
