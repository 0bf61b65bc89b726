// An HTTP/1.1 server for kvfleet's processes: the router's OpenAI API and every
// process's /health, /ready and /metrics.
//
// Boost.Beast underneath (only server.cc and connection.cc include it, so users of this
// header compile fast). Keep-alive connections, a pool of I/O threads, limits on header
// and body size, an idle timeout, and a route table of exact (method, path) matches.
//
// A handler receives an Exchange: the parsed request plus the means to answer it, now or
// later, from any thread. It either Reply()s once, or StartStream()s a chunked response
// (Server-Sent Events) and Write()s to it until Finish(). An Exchange learns when its
// client disconnects, so a streaming handler can cancel the work behind it.
//
// Thread safety: Server is thread-safe. Exchange is thread-safe; handlers run on an I/O
// thread and must not block it (hand long work to another thread and answer later). A
// handler may keep per-thread state on its Exchange's IoThread.
//
// Hardening: a request whose framing is ambiguous (a Transfer-Encoding not ending in chunked,
// RFC 9112 §6.3) is a 400 that closes the connection, and one with a transfer coding other
// than chunked a 501; a failing accept (out of descriptors) backs off instead of spinning;
// connections beyond ServerOptions::max_connections are closed as accepted; in a response
// header, control bytes of the value become spaces and a name that is no token drops the
// header, so no value (a worker's name, say) can add a line.
//
// Metrics (Server::Start's registry): kvfleet_http_accept_errors_total{reason} (emfile, enfile,
// enobufs, enomem, other), kvfleet_http_connections_refused_total (over max_connections),
// kvfleet_http_open_connections, kvfleet_http_slow_reader_closes_total,
// kvfleet_http_requests_refused_total{status} (answered by the server itself: 400, 413, 431,
// 501) and kvfleet_http_dropped_exchanges_total (invariant 1's 500s).
//
// Invariants:
//   1. Every request gets exactly one response; an Exchange dropped without one answers
//      500 (and is counted), unless its client had left.
//   2. A connection processes one request at a time, in order (no pipelined responses
//      overlap).
//   3. OnClientGone callbacks run at most once, on an I/O thread, never after Finish() or
//      Reply() completed the response.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace prometheus {
class Registry;
}

namespace kvfleet::http {

struct ServerOptions {
  std::string address = "0.0.0.0";  // listen address
  uint16_t port = 8000;              // 0: an ephemeral port (see Server::port())
  int io_threads = 2;                // threads running the connections
  size_t max_header_bytes = 16 * 1024;        // request line + headers; over it: 431
  size_t max_body_bytes = 8 * 1024 * 1024;    // over it: 413
  int64_t idle_timeout_ms = 60'000;   // keep-alive connection with no request in flight
  int64_t read_timeout_ms = 30'000;   // a request must arrive whole within this
  // A client that reads slower than its response is produced: past this many bytes queued
  // behind the write in progress the connection is closed (and the Exchange sees the client
  // gone). One piece larger than this, first in line (a whole reply, a stream's head and
  // first chunk), is still written whole.
  size_t max_pending_write_bytes = 8 * 1024 * 1024;
  // Connections open at once; one accepted beyond them is closed at once (and counted). Each
  // holds a descriptor and a read buffer: keep it under the process's RLIMIT_NOFILE.
  size_t max_connections = 4096;
};

using Headers = std::vector<std::pair<std::string, std::string>>;

struct Request {
  std::string method;  // "GET", "POST", ...
  std::string target;  // as sent: path and query
  std::string path;    // target without the query
  Headers headers;     // names as sent
  std::string body;
  bool keep_alive = true;

  // The first header of that name (case-insensitive); empty when absent.
  std::string_view Header(std::string_view name) const;
};

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  Headers headers;  // extra headers (Retry-After, ...)
  std::string body;
};

class Connection;  // connection.h

// One of the server's I/O threads, for per-thread work beside its connections: the router
// forwards each request from the I/O thread that read it and reads the worker's answer
// there too, so no other thread wakes on the request path.
//
// Thread safety: Post() from any thread; everything else only on this I/O thread (or
// once the server stopped and its threads ended).
class IoThread {
 public:
  virtual ~IoThread() = default;
  // Runs `fn` on this thread.
  virtual void Post(std::function<void()> fn) = 0;
  // A watch on a file descriptor; destroying it (on this thread) ends the watch.
  class Watch {
   public:
    virtual ~Watch() = default;
  };
  // Calls `on_readable` on this thread each time `fd` is (or becomes) readable, until the
  // watch is destroyed. The fd stays the caller's; it must outlive the watch. Readiness is
  // re-checked after each call, so an fd drained inside the call is not reported again.
  virtual std::unique_ptr<Watch> WatchReadable(int fd, std::function<void()> on_readable) = 0;
  // An object kept for this thread: destroyed after the thread ended (Server::Stop), while
  // the thread's watches can still be destroyed. One per thread, for the one handler layer
  // that runs on the server.
  virtual void* attachment() const = 0;
  virtual void set_attachment(std::shared_ptr<void> object) = 0;
};

// One request and its response. Created by the server, shared with the handler.
class Exchange {
 public:
  Exchange(std::shared_ptr<Connection> connection, Request request);
  ~Exchange();  // answers 500 when no response was started (invariant 1)
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;

  const Request& request() const { return request_; }
  // The I/O thread this exchange's connection runs on (handlers, OnClientGone callbacks).
  IoThread* io_thread() const;

  // Sends a whole response. REQUIRES: no response started yet (later calls are ignored).
  void Reply(Response response);
  // Starts a chunked response. REQUIRES: no response started yet.
  void StartStream(int status, std::string_view content_type, Headers headers = {});
  // Queues `data` as one chunk. Returns false when the client is gone (data dropped).
  // REQUIRES: StartStream() was called.
  bool Write(std::string_view data);
  // Ends the chunked response.
  void Finish();

  bool client_gone() const { return gone_.load(std::memory_order_acquire); }
  // Runs `callback` once when the client disconnects before the response completes; at
  // once (on the caller's thread) if it already has. Replaces an earlier callback.
  void OnClientGone(std::function<void()> callback);

  // Called by the connection (I/O thread).
  void MarkClientGone();

 private:
  std::shared_ptr<Connection> connection_;
  Request request_;
  std::atomic<bool> started_{false};
  std::atomic<bool> finished_{false};
  std::atomic<bool> gone_{false};
  std::mutex mu_;
  std::function<void()> on_gone_;  // GUARDED_BY(mu_)
};

using Handler = std::function<void(std::shared_ptr<Exchange>)>;

// The route table: exact (method, path) matches. Unknown path: 404; known path, other
// method: 405. Built before Start(); immutable afterwards.
class Routes {
 public:
  void Add(std::string method, std::string path, Handler handler);
  // A synchronous handler: the response is computed on the I/O thread.
  void AddSync(std::string method, std::string path, std::function<Response(const Request&)> handler);
  // How the server words its own errors (400, 404, 405, 413, 431, 500, 501); default: a JSON
  // {"error":{"message":...,"code":status}} body.
  void SetErrorFormatter(std::function<Response(int status, std::string_view message)> formatter);
  // Runs `init` once on each I/O thread as the server starts, before that thread serves
  // any request: per-thread state of the handler layer (the router's forwarding lanes) is
  // then ready for the first request.
  void OnThreadStart(std::function<void(IoThread*)> init);
  const std::function<void(IoThread*)>& thread_start() const { return thread_start_; }

  // Looks up a handler; nullptr with *status 404 or 405 when there is none.
  const Handler* Find(std::string_view method, std::string_view path, int* status) const;
  Response FormatError(int status, std::string_view message) const;

 private:
  struct Route {
    std::string method;
    std::string path;
    Handler handler;
  };
  std::vector<Route> routes_;
  std::function<Response(int, std::string_view)> error_formatter_;
  std::function<void(IoThread*)> thread_start_;
};

class ServerImpl;

class Server {
 public:
  // Binds, listens and starts the I/O threads. The server's metrics (above) go into
  // `registry`; null: nowhere exported.
  static Result<std::unique_ptr<Server>> Start(const ServerOptions& options, Routes routes,
                                               std::shared_ptr<prometheus::Registry> registry = nullptr);
  ~Server();  // Stop()s
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // The bound port (useful with options.port = 0).
  uint16_t port() const;
  // Stops accepting, closes every connection (in-flight Exchanges see the client gone)
  // and joins the I/O threads. Idempotent.
  void Stop();

 private:
  explicit Server(std::unique_ptr<ServerImpl> impl);
  std::unique_ptr<ServerImpl> impl_;
};

// The standard reason phrase for a status code ("Not Found").
std::string_view ReasonPhrase(int status);

// Parses one HTTP/1.x request from `bytes` with the server's parser and limits. Returns
// the request, or a Status whose message is the HTTP status to answer ("413: ...").
// The server uses the same parser configuration; fuzzers and tests call this directly.
Result<Request> ParseRequest(std::string_view bytes, const ServerOptions& limits);

}  // namespace kvfleet::http
