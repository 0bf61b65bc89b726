// A fake OpenAI /v1/completions server for kvfleet bench tests (see the class comment).
#pragma once

#include <atomic>
#include <cctype>
#include <csignal>
#include <limits>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

namespace kvfleet::bench::testing {

namespace asio = boost::asio;
using asio::ip::tcp;

// A stand-in for the router's /v1/completions, one thread per connection (a test has a
// handful). GET answers 200 (readiness), with one model "fake" for /v1/models. Behaviour is chosen by the request's max_tokens:
//   3, 9, 10 -> 503, 429, 504 with an OpenAI error body;
//   4  -> streams two tokens and closes without [DONE];
//   11 -> as otherwise, after 300 ms before the first token;
//   otherwise -> max_tokens token chunks, a final chunk, a usage chunk with
//                cached_tokens = prompt length / 2, then [DONE].
// The serving worker, in x-kvfleet-worker, is "w" + the prompt's first token mod 2.
class FakeOpenAiServer {
 public:
  FakeOpenAiServer() : acceptor_(io_, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)) {
    // A client that hangs up mid-answer (a bench that gave up) must cost a write error, not
    // the test process (bench_cli_test died of SIGPIPE now and then).
    std::signal(SIGPIPE, SIG_IGN);
    accept_thread_ = std::thread([this] { AcceptLoop(); });
  }
  ~FakeOpenAiServer() {
    stopping_ = true;
    boost::system::error_code ec;
    // Wake the blocking accept with one last connection.
    tcp::socket poke(io_);
    poke.connect(acceptor_.local_endpoint(), ec);
    accept_thread_.join();
    std::lock_guard lock(mu_);
    for (auto& t : connections_) t.join();
  }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(acceptor_.local_endpoint().port()); }
  int max_concurrent() const { return max_concurrent_.load(); }
  int gets() const { return gets_.load(); }
  // From the second GET /fleet on, one routable worker fewer (a worker lost after the start).
  void LoseAWorkerAfterFirstFleet() { LoseAWorkerAfterFleetGets(1); }
  // From GET /fleet number `gets` + 1 on, one routable worker fewer.
  void LoseAWorkerAfterFleetGets(int gets) { lose_after_gets_ = gets; }
  std::vector<nlohmann::json> bodies() {
    std::lock_guard lock(mu_);
    return bodies_;
  }

 private:
  void AcceptLoop() {
    while (true) {
      tcp::socket socket(io_);
      boost::system::error_code ec;
      acceptor_.accept(socket, ec);
      if (stopping_ || ec) return;
      std::lock_guard lock(mu_);
      connections_.emplace_back([this, s = std::move(socket)]() mutable { Serve(std::move(s)); });
    }
  }

  static void Write(tcp::socket& s, const std::string& bytes) {
    boost::system::error_code ec;
    asio::write(s, asio::buffer(bytes), ec);
  }
  static std::string Chunk(const std::string& data) {
    std::ostringstream o;
    o << std::hex << data.size() << "\r\n" << data << "\r\n";
    return o.str();
  }
  static std::string Sse(const nlohmann::json& j) { return Chunk("data: " + j.dump() + "\n\n"); }

  // Reads one request by hand (request line, headers up to the blank line, then
  // Content-Length bytes of body): enough for the bench client, and independent of the
  // Beast parser under test on the other side.
  static bool ReadRequest(tcp::socket& socket, std::string* method, std::string* target, std::string* body) {
    asio::streambuf buf;
    boost::system::error_code ec;
    size_t head_len = asio::read_until(socket, buf, "\r\n\r\n", ec);
    if (ec) return false;
    std::string data(asio::buffers_begin(buf.data()), asio::buffers_end(buf.data()));
    std::string head = data.substr(0, head_len);
    std::istringstream line(head.substr(0, head.find("\r\n")));
    line >> *method >> *target;
    size_t length = 0;
    std::istringstream headers(head);
    for (std::string h; std::getline(headers, h);) {
      for (auto& c : h) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (h.rfind("content-length:", 0) == 0) length = std::stoul(h.substr(15));
    }
    *body = data.substr(head_len);
    if (body->size() < length) {
      std::string rest(length - body->size(), '\0');
      asio::read(socket, asio::buffer(rest), ec);
      if (ec) return false;
      *body += rest;
    }
    return true;
  }

  void Serve(tcp::socket socket) {
    std::string method, target, request_body;
    if (!ReadRequest(socket, &method, &target, &request_body)) return;
    if (method == "GET") {  // /health, /ready, /v1/models, /fleet (two routable workers, one not)
      ++gets_;
      const bool lost = target == "/fleet" && fleet_gets_++ >= lose_after_gets_;
      std::string body = target == "/v1/models" ? R"({"object":"list","data":[{"id":"fake"}]})"
                         : target == "/fleet"   ? std::string(R"({"workers":[{"routable":true},{"routable":false},)") +
                                                    (lost ? R"({"routable":false})" : R"({"routable":true})") +
                                                    R"(],"refused":[],"ready":true})"
                                                : "";
      Write(socket, "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) +
                        "\r\nConnection: close\r\n\r\n" + body);
      return;
    }
    int now = ++concurrent_;
    for (int seen = max_concurrent_.load(); now > seen && !max_concurrent_.compare_exchange_weak(seen, now);) {
    }
    nlohmann::json body = nlohmann::json::parse(request_body);
    {
      std::lock_guard lock(mu_);
      bodies_.push_back(body);
    }
    const int max_tokens = body["max_tokens"].get<int>();
    const size_t prompt_len = body["prompt"].size();
    const std::string worker = "w" + std::to_string(body["prompt"][0].get<uint32_t>() % 2);
    if (max_tokens == 3 || max_tokens == 9 || max_tokens == 10) {
      const char* status = max_tokens == 3 ? "503 Service Unavailable"
                           : max_tokens == 9 ? "429 Too Many Requests"
                                             : "504 Gateway Timeout";
      std::string err = R"({"error":{"message":"no live worker","type":"server_error","code":503}})";
      --concurrent_;
      Write(socket, std::string("HTTP/1.1 ") + status + "\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
                    "x-kvfleet-worker: " + worker + "\r\nContent-Length: " + std::to_string(err.size()) +
                        "\r\nConnection: close\r\n\r\n" + err);
      return;
    }
    if (max_tokens == 11) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    Write(socket, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                  "x-kvfleet-worker: " + worker + "\r\nConnection: close\r\n\r\n");
    const int tokens = max_tokens == 4 ? 2 : max_tokens;
    for (int i = 0; i < tokens; ++i) {
      Write(socket, Sse({{"object", "text_completion"},
                         {"choices", {{{"index", 0}, {"text", "t"}, {"finish_reason", nullptr}}}}}));
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (max_tokens == 4) {
      --concurrent_;
      Write(socket, "0\r\n\r\n");
      return;
    }
    Write(socket, Sse({{"choices", {{{"index", 0}, {"text", ""}, {"finish_reason", "length"}}}}}));
    Write(socket, Sse({{"choices", nlohmann::json::array()},
                       {"usage",
                        {{"prompt_tokens", prompt_len},
                         {"completion_tokens", max_tokens},
                         {"total_tokens", prompt_len + max_tokens},
                         {"prompt_tokens_details", {{"cached_tokens", prompt_len / 2}}}}}}));
    --concurrent_;
    Write(socket, Chunk("data: [DONE]\n\n") + "0\r\n\r\n");
  }

  asio::io_context io_;
  tcp::acceptor acceptor_;
  std::thread accept_thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> concurrent_{0};
  std::atomic<int> max_concurrent_{0};
  std::atomic<int> gets_{0};
  std::atomic<int> fleet_gets_{0};
  std::atomic<int> lose_after_gets_{std::numeric_limits<int>::max()};
  std::mutex mu_;
  std::vector<std::thread> connections_;  // GUARDED_BY(mu_)
  std::vector<nlohmann::json> bodies_;    // GUARDED_BY(mu_)
};

}  // namespace kvfleet::bench::testing
