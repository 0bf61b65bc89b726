// A client connection of the HTTP server (server.h): reads requests, hands each to its
// route's handler as an Exchange, and writes what the Exchange delivers. Private to
// common/http: server.cc accepts connections and connection.cc runs them. The only header
// here that includes Boost.Beast.
//
// Thread safety: Deliver() and PostClose() from any thread; the rest on the connection's
// strand.
#pragma once

#include <atomic>
#include <cstddef>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "common/http/server.h"
#include "common/http/server_metrics.h"

namespace kvfleet::http {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Parser = bhttp::request_parser<bhttp::string_body>;

// One client connection. Every member is touched only on the connection's strand.
//
// Reading: a request is read (header, then body after "100 Continue" when asked). While
// its response is in progress a small "watch" read stays armed: it completes with an
// error when the client goes away (the Exchange is told) and otherwise reads ahead the
// next pipelined request into the same buffer. When the response completes the watch
// read is cancelled and the next request is parsed from the buffer.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  // `socket` is counted open in `metrics` (ServerMetrics::TryOpen); the connection counts it
  // closed once.
  Connection(tcp::socket socket, const ServerOptions& options, const Routes* routes, IoThread* io_thread,
             std::shared_ptr<ServerMetrics> metrics)
      : stream_(std::move(socket)), options_(options), routes_(routes), io_thread_(io_thread),
        metrics_(std::move(metrics)) {}
  ~Connection();

  void Start();

  // Any thread: queue bytes of the current response. `last`: the response is complete
  // after them; `close`: close the connection once they are sent.
  //
  // Pieces delivered back to back (a stream's head and first chunk; the last chunk, usage
  // and [DONE]) leave in one write: one send and one client wake-up instead of several.
  // A piece is held only while another Deliver is already posted behind it.
  void Deliver(std::string bytes, bool last, bool close);

  void PostClose();

  const Routes& routes() const { return *routes_; }
  ServerMetrics& metrics() const { return *metrics_; }
  IoThread* io_thread() const { return io_thread_; }

 private:
  void ReadRequest();
  void OnHeader(beast::error_code ec);
  void OnReadError(beast::error_code ec);
  // Answers the server's own error for the request being read, then closes.
  void Refuse(int status, std::string_view message);
  void OnRequest();
  void StartWatch();
  void OnWatch(beast::error_code ec, size_t n);
  void Queue(std::string bytes, bool write_now = true);
  void Flush();
  void DoWrite();
  void OnWrite(beast::error_code ec, size_t n);
  void OnResponseComplete();
  void Close();

  beast::tcp_stream stream_;
  const ServerOptions& options_;
  const Routes* routes_;
  IoThread* io_thread_;
  std::shared_ptr<ServerMetrics> metrics_;
  beast::flat_buffer buffer_;
  std::optional<Parser> parser_;
  std::weak_ptr<Exchange> exchange_;
  std::deque<std::string> out_;
  std::string inflight_;
  size_t queued_bytes_ = 0;     // the bytes in out_: queued behind the write in flight
  bool reading_ = false;        // a read (request or watch) is outstanding
  bool writing_ = false;
  std::atomic<int> pending_delivers_{0};  // Deliver()s posted and not yet run (any thread)
  bool responding_ = false;     // a request was read and its response is not yet sent
  bool response_done_ = false;  // the response's last bytes are queued
  bool close_after_ = false;
  bool closed_ = false;
};

}  // namespace kvfleet::http
