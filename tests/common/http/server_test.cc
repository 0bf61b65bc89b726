// The HTTP server: routing, keep-alive, limits, streaming and client disconnects.
#include "common/http/server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include <doctest/doctest.h>

#include <prometheus/registry.h>

#include "common/http/metrics.h"
#include "tests/common/http/test_client.h"

namespace kvfleet::http {

using testing::Client;

namespace {


ServerOptions TestOptions() {
  ServerOptions o;
  o.address = "127.0.0.1";
  o.port = 0;
  o.io_threads = 2;
  o.max_header_bytes = 1024;
  o.max_body_bytes = 4096;
  return o;
}

Routes EchoRoutes() {
  Routes routes;
  routes.AddSync("GET", "/hello", [](const Request&) {
    Response r;
    r.content_type = "text/plain";
    r.body = "hi";
    return r;
  });
  routes.AddSync("POST", "/echo", [](const Request& req) {
    Response r;
    r.body = req.body;
    r.headers.emplace_back("X-Got", std::string(req.Header("x-test")));
    return r;
  });
  routes.Add("GET", "/drop", [](std::shared_ptr<Exchange>) {});
  return routes;
}

}  // namespace

TEST_CASE("two requests on one keep-alive connection get their responses in order") {
  auto server = Server::Start(TestOptions(), EchoRoutes());
  REQUIRE(server.ok());
  Client c((*server)->port());
  c.Send("GET /hello HTTP/1.1\r\nHost: x\r\n\r\nPOST /echo HTTP/1.1\r\nHost: x\r\nX-Test: abc\r\nContent-Length: 5\r\n\r\nhello");
  std::string first = c.ReadUntil("hi");
  CHECK(first.find("HTTP/1.1 200 OK") == 0);
  std::string second = c.ReadUntil("hello");
  CHECK(second.find("HTTP/1.1 200 OK") == 0);
  CHECK(second.find("X-Got: abc") != std::string::npos);
}

TEST_CASE("unknown paths answer 404 and wrong methods 405") {
  auto server = Server::Start(TestOptions(), EchoRoutes());
  REQUIRE(server.ok());
  Client c((*server)->port());
  c.Send("GET /nope HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK(c.ReadUntil("}}").find("HTTP/1.1 404") == 0);
  c.Send("DELETE /hello HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK(c.ReadUntil("}}").find("HTTP/1.1 405") == 0);
}

TEST_CASE("a body over the limit answers 413 and a header over the limit 431") {
  auto server = Server::Start(TestOptions(), EchoRoutes());
  REQUIRE(server.ok());
  {
    Client c((*server)->port());
    c.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n");
    std::string r = c.ReadUntil("}}");
    CHECK(r.find("HTTP/1.1 413") == 0);
    CHECK(r.find("Connection: close") != std::string::npos);
  }
  {
    Client c((*server)->port());
    c.Send("GET /hello HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(2000, 'a') + "\r\n\r\n");
    CHECK(c.ReadUntil("}}").find("HTTP/1.1 431") == 0);
  }
  {
    Client c((*server)->port());
    c.Send("GARBAGE\r\n\r\n");
    CHECK(c.ReadUntil("}}").find("HTTP/1.1 400") == 0);
  }
}

TEST_CASE("Expect: 100-continue is answered before the body is sent") {
  auto server = Server::Start(TestOptions(), EchoRoutes());
  REQUIRE(server.ok());
  Client c((*server)->port());
  c.Send("POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n");
  CHECK(c.ReadUntil("\r\n\r\n").find("HTTP/1.1 100 Continue") == 0);
  c.Send("abc");
  CHECK(c.ReadUntil("abc").find("HTTP/1.1 200") == 0);
}

TEST_CASE("a handler that drops its exchange answers 500") {
  auto server = Server::Start(TestOptions(), EchoRoutes());
  REQUIRE(server.ok());
  Client c((*server)->port());
  c.Send("GET /drop HTTP/1.1\r\nHost: x\r\n\r\n");
  CHECK(c.ReadUntil("}}").find("HTTP/1.1 500") == 0);
}

TEST_CASE("a streamed response arrives as chunks, and a client that leaves is noticed") {
  std::mutex mu;
  std::condition_variable cv;
  std::shared_ptr<Exchange> held;
  bool gone = false;
  Routes routes;
  routes.Add("GET", "/stream", [&](std::shared_ptr<Exchange> ex) {
    ex->StartStream(200, "text/event-stream");
    ex->Write("data: one\n\n");
    ex->OnClientGone([&] {
      std::lock_guard<std::mutex> lock(mu);
      gone = true;
      cv.notify_all();
    });
    std::lock_guard<std::mutex> lock(mu);
    held = ex;
    cv.notify_all();
  });
  auto server = Server::Start(TestOptions(), std::move(routes));
  REQUIRE(server.ok());
  {
    Client c((*server)->port());
    c.Send("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
    std::string head = c.ReadUntil("data: one\n\n");
    CHECK(head.find("Transfer-Encoding: chunked") != std::string::npos);
    CHECK(head.find("b\r\ndata: one\n\n") != std::string::npos);
    // The stream finishes from another thread.
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return held != nullptr; });
    }
    std::thread([ex = held] {
      ex->Write("data: two\n\n");
      ex->Finish();
    }).join();
    CHECK(c.ReadUntil("0\r\n\r\n").find("data: two") != std::string::npos);
    held.reset();
    // The connection is reusable after a stream, and a client that then leaves mid-stream
    // is reported.
    c.Send("GET /stream HTTP/1.1\r\nHost: x\r\n\r\n");
    c.ReadUntil("data: one\n\n");
    c.Close();
  }
  std::unique_lock<std::mutex> lock(mu);
  CHECK(cv.wait_for(lock, std::chrono::seconds(5), [&] { return gone; }));
  CHECK(held->client_gone());
  CHECK_FALSE(held->Write("data: late\n\n"));
  held.reset();
}

// Per-thread state on an I/O thread: an attachment made by the handler and an fd watch
// whose callback answers the request on that same thread (as the router's lanes do).
struct PerThread {
  int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  std::thread::id thread;
  std::unique_ptr<IoThread::Watch> watch;
  std::vector<std::shared_ptr<Exchange>> waiting;  // answered when fd is readable
  std::atomic<int>* destroyed;
  explicit PerThread(std::atomic<int>* d) : destroyed(d) {}
  ~PerThread() {
    watch.reset();
    ::close(fd);
    ++*destroyed;
  }
};

TEST_CASE("OnThreadStart runs once on each I/O thread before it serves a request") {
  std::mutex mu;
  std::map<IoThread*, std::thread::id> started;  // GUARDED_BY(mu)
  Routes routes;
  routes.OnThreadStart([&](IoThread* io) {
    std::lock_guard<std::mutex> lock(mu);
    CHECK(started.emplace(io, std::this_thread::get_id()).second);
  });
  routes.AddSync("GET", "/hello", [](const Request&) { return Response{}; });
  routes.Add("GET", "/where", [&](std::shared_ptr<Exchange> ex) {
    Response r;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = started.find(ex->io_thread());
      r.body = it != started.end() && it->second == std::this_thread::get_id() ? "started here|end" : "not started|end";
    }
    ex->Reply(std::move(r));
  });
  auto server = Server::Start(TestOptions(), std::move(routes));
  REQUIRE(server.ok());
  for (int i = 0; i < 6; ++i) {  // connections spread over both I/O threads
    Client c((*server)->port());
    c.Send("GET /where HTTP/1.1\r\nHost: x\r\n\r\n");
    CHECK(c.ReadUntil("|end").find("started here") != std::string::npos);
  }
  (*server)->Stop();
  std::lock_guard<std::mutex> lock(mu);
  CHECK(started.size() == 2);
}

TEST_CASE("an fd watch on an I/O thread answers there; attachments last until the server stops") {
  std::atomic<int> destroyed{0};
  Routes routes;
  routes.Add("GET", "/later", [&](std::shared_ptr<Exchange> ex) {
    IoThread* io = ex->io_thread();
    REQUIRE(io != nullptr);
    auto* pt = static_cast<PerThread*>(io->attachment());
    if (pt == nullptr) {
      auto made = std::make_shared<PerThread>(&destroyed);
      pt = made.get();
      pt->thread = std::this_thread::get_id();
      pt->watch = io->WatchReadable(pt->fd, [pt] {
        uint64_t v;
        while (::read(pt->fd, &v, sizeof(v)) > 0) {
        }
        CHECK(std::this_thread::get_id() == pt->thread);
        for (auto& waiting : pt->waiting) {
          Response r;
          r.body = "done";
          waiting->Reply(std::move(r));
        }
        pt->waiting.clear();
      });
      io->set_attachment(std::move(made));
    }
    CHECK(std::this_thread::get_id() == pt->thread);
    pt->waiting.push_back(ex);
    // Another thread makes the fd readable; the answer comes from the watch.
    int fd = pt->fd;
    std::thread([fd] {
      uint64_t one = 1;
      (void)!::write(fd, &one, sizeof(one));
    }).detach();
  });
  auto server = Server::Start(TestOptions(), std::move(routes));
  REQUIRE(server.ok());
  for (int i = 0; i < 6; ++i) {  // several connections: both I/O threads, each watch re-armed
    Client c((*server)->port());
    c.Send("GET /later HTTP/1.1\r\nHost: x\r\n\r\n");
    CHECK(c.ReadUntil("done").find("200 OK") != std::string::npos);
  }
  CHECK(destroyed.load() == 0);
  (*server)->Stop();
  CHECK(destroyed.load() == 2);
}

TEST_CASE("ParseRequest applies the server's limits") {
  ServerOptions limits = TestOptions();
  auto ok = ParseRequest("POST /v1/x?q=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhi", limits);
  REQUIRE(ok.ok());
  CHECK(ok->path == "/v1/x");
  CHECK(ok->body == "hi");
  CHECK(ok->Header("HOST") == "a");
  auto big = ParseRequest("POST / HTTP/1.1\r\nContent-Length: 99999\r\n\r\n", limits);
  REQUIRE_FALSE(big.ok());
  CHECK(big.status().message().rfind("413", 0) == 0);
  CHECK_FALSE(ParseRequest("GET / HTTP/1.1\r\nHost", limits).ok());
  // Regression (router_http_fuzzer): a body shorter than its Content-Length used to spin.
  CHECK_FALSE(ParseRequest("POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc", limits).ok());
}

TEST_CASE("SerializeMetrics writes the text format") {
  auto registry = std::make_shared<prometheus::Registry>();
  Routes routes;
  AddMetricsRoute(routes, registry);
  int status = 0;
  CHECK(routes.Find("GET", "/metrics", &status) != nullptr);
  CHECK(SerializeMetrics(*registry).empty());
}

}  // namespace kvfleet::http
