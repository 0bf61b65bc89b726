// One connection and its exchanges: the request parser with the server's limits, the
// connection's read / write loop (connection.h), the wire format of responses (whole or
// chunked), and Exchange, through which a handler answers. The listener, the I/O threads
// and the route table are in server.cc.
#include "common/http/connection.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/rfc7230.hpp>

#include "common/log.h"

namespace kvfleet::http {

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

// A request whose header was read, against RFC 9112's framing rules: 0 when its body can be
// read as framed, else the status to answer before closing. Beast already refuses
// Content-Length beside chunked; a Transfer-Encoding it does not end in chunked is read as
// an empty body, which would parse the body as the next request (§6.3: 400).
int CheckFraming(const Parser& parser, std::string* why) {
  const auto& msg = parser.get();
  auto [first, last] = msg.equal_range(bhttp::field::transfer_encoding);
  if (first == last) return 0;
  if (msg.version() < 11) {
    *why = "Transfer-Encoding in an HTTP/1.0 request";
    return 400;
  }
  if (!parser.chunked()) {
    *why = "the last Transfer-Encoding is not chunked";
    return 400;
  }
  for (auto field = first; field != last; ++field) {
    for (auto coding : bhttp::token_list(field->value())) {
      if (!beast::iequals(coding, "chunked")) {
        *why = "Transfer-Encoding '" + std::string(coding) + "' is not implemented";
        return 501;  // §6.1: a coding the server does not understand
      }
    }
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

// RFC 9110 §5.1: a field name is a token.
bool IsToken(std::string_view name) {
  constexpr std::string_view kPunctuation = "!#$%&'*+-.^_`|~";
  return !name.empty() && std::all_of(name.begin(), name.end(), [&](char c) {
           return std::isalnum(static_cast<unsigned char>(c)) || kPunctuation.find(c) != std::string_view::npos;
         });
}

// RFC 9110 §5.5: a field value holds no CR, LF or NUL. Every control byte but HTAB, and DEL,
// becomes a space, so that no value (a worker's name, a client's model) can end its line
// and start a header of its own.
void AppendFieldValue(std::string& head, std::string_view name, std::string_view value) {
  bool replaced = false;
  for (char c : value) {
    const auto u = static_cast<unsigned char>(c);
    const bool control = (u < 0x20 && c != '\t') || u == 0x7f;
    head += control ? ' ' : c;
    replaced |= control;
  }
  static RateLimit log_limit(config::kLogIntervalMs);
  uint64_t skipped = 0;
  if (replaced && log_limit.Allow(&skipped)) {
    Logger("http")->warn("response header {}: control bytes in its value {} replaced by spaces ({} more since the "
                         "last report)",
                         name, EscapeForLog(value), skipped);
  }
}

void AppendField(std::string& head, std::string_view name, std::string_view value) {
  if (!IsToken(name)) {
    static RateLimit log_limit(config::kLogIntervalMs);
    uint64_t skipped = 0;
    if (log_limit.Allow(&skipped)) {
      Logger("http")->warn("dropping response header {}: not a valid field name ({} more since the last report)",
                           EscapeForLog(name), skipped);
    }
    return;
  }
  head += name;
  head += ": ";
  AppendFieldValue(head, name, value);
  head += "\r\n";
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
  if (!content_type.empty()) AppendField(head, "Content-Type", content_type);
  for (const auto& [name, value] : headers) AppendField(head, name, value);
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

}  // namespace

// --- Connection ---

void Connection::Start() {
  buffer_.reserve(kInitialReadBuffer);
  beast::error_code ec;
  stream_.socket().set_option(tcp::no_delay(true), ec);  // SSE chunks are small: send at once
  net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->ReadRequest(); });
}

void Connection::Deliver(std::string bytes, bool last, bool close) {
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

void Connection::PostClose() {
  net::post(stream_.get_executor(), [self = shared_from_this()] { self->Close(); });
}

void Connection::ReadRequest() {
  if (closed_) return;
  parser_.emplace();
  ConfigureParser(*parser_, options_);
  stream_.expires_after(std::chrono::milliseconds(buffer_.size() > 0 ? options_.read_timeout_ms
                                                                       : options_.idle_timeout_ms));
  reading_ = true;
  bhttp::async_read_header(stream_, buffer_, *parser_,
                           [self = shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
}

void Connection::OnHeader(beast::error_code ec) {
  reading_ = false;
  if (ec) return OnReadError(ec);
  std::string why;
  if (int status = CheckFraming(*parser_, &why)) return Refuse(status, why);
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

void Connection::OnReadError(beast::error_code ec) {
  int status = StatusForReadError(ec);
  if (status == 0 || closed_) return Close();
  Refuse(status, ec.message());
}

void Connection::Refuse(int status, std::string_view message) {
  // Answer the error and close: the rest of the stream cannot be trusted.
  metrics_->CountRefusedRequest(status);
  parser_.reset();
  responding_ = true;
  response_done_ = true;
  close_after_ = true;
  stream_.expires_after(std::chrono::milliseconds(options_.read_timeout_ms));
  Response r = routes_->FormatError(status, message);
  Queue(FormatWhole(r, false));
}

void Connection::OnRequest() {
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
    Logger("http")->error("handler for {} threw: {}", EscapeForLog(path), e.what());
  }
}

void Connection::StartWatch() {
  if (reading_ || closed_ || buffer_.size() >= kMaxReadAhead) return;
  reading_ = true;
  stream_.async_read_some(buffer_.prepare(kWatchReadBytes),
                          [self = shared_from_this()](beast::error_code ec, size_t n) { self->OnWatch(ec, n); });
}

void Connection::OnWatch(beast::error_code ec, size_t n) {
  reading_ = false;
  if (ec == net::error::operation_aborted && !responding_ && !closed_) return ReadRequest();
  if (ec) return Close();
  buffer_.commit(n);
  if (responding_) return StartWatch();
  ReadRequest();
}

void Connection::Queue(std::string bytes, bool write_now) {
  if (closed_) return;
  // The slow-reader rule bounds the backlog that piles up behind a write in progress, not
  // one piece: a piece first in line (a whole reply, a stream's head with its first chunk)
  // goes out whole however large, while a stream whose client stops reading is cut off.
  if (writing_ && !out_.empty() && queued_bytes_ + bytes.size() > options_.max_pending_write_bytes) {
    static RateLimit log_limit(config::kLogIntervalMs);
    uint64_t skipped = 0;
    if (log_limit.Allow(&skipped)) {
      Logger("http")->warn("closing a connection whose client reads too slowly ({} bytes waiting behind a write "
                           "of {}; {} more such closes since the last report)",
                           queued_bytes_ + bytes.size(), inflight_.size(), skipped);
    }
    metrics_->CountSlowReader();
    return Close();
  }
  queued_bytes_ += bytes.size();
  out_.push_back(std::move(bytes));
  if (write_now) Flush();
}

void Connection::Flush() {
  if (!writing_ && !out_.empty() && !closed_) DoWrite();
}

void Connection::DoWrite() {
  // Gather everything queued into one write (a lone piece, a whole reply, moves as it is).
  if (out_.size() == 1) {
    inflight_ = std::move(out_.front());
  } else {
    inflight_.clear();
    for (auto& s : out_) inflight_ += s;
  }
  out_.clear();
  queued_bytes_ = 0;
  writing_ = true;
  net::async_write(stream_, net::buffer(inflight_), [self = shared_from_this()](beast::error_code ec, size_t n) {
    self->OnWrite(ec, n);
  });
}

void Connection::OnWrite(beast::error_code ec, size_t) {
  writing_ = false;
  if (ec) return Close();
  if (!out_.empty()) return DoWrite();
  if (responding_ && response_done_) OnResponseComplete();
}

void Connection::OnResponseComplete() {
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

Connection::~Connection() {
  if (!closed_) metrics_->Closed();  // dropped unclosed, as when the server stops
}

void Connection::Close() {
  if (closed_) return;
  closed_ = true;
  metrics_->Closed();
  if (responding_ && !response_done_) {
    if (auto exchange = exchange_.lock()) exchange->MarkClientGone();
  }
  exchange_.reset();
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
  stream_.close();
}

// --- Exchange ---

Exchange::Exchange(std::shared_ptr<Connection> connection, Request request)
    : connection_(std::move(connection)), request_(std::move(request)) {}

IoThread* Exchange::io_thread() const { return connection_->io_thread(); }

Exchange::~Exchange() {
  if (!started_.load()) {
    // A client that left (its handler cancelled the work) has no one to answer.
    if (gone_.load()) return;
    connection_->metrics().CountDropped();
    Logger("http")->error("no response to {} {}: answering 500", request_.method, EscapeForLog(request_.path));
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

// --- Parsing without a connection (fuzzers, tests) ---

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
  std::string why;
  if (int status = CheckFraming(parser, &why)) return InvalidArgument(std::to_string(status) + ": " + why);
  return FromParsed(parser.release());
}

}  // namespace kvfleet::http
