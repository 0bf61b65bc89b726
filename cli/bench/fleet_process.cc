#include "cli/bench/fleet_process.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

namespace kvfleet::bench {

namespace {
// How often WaitReady() asks /ready, and how often Stop() checks that the group exited.
constexpr auto kPollPeriod = std::chrono::milliseconds(200);
constexpr auto kStopPollPeriod = std::chrono::milliseconds(20);
}  // namespace

FleetProcess::~FleetProcess() { Stop(); }

Status FleetProcess::Start(const std::string& command) {
  if (pid_ > 0) return FailedPrecondition("fleet already running");
  // Orphans of the command's shell (it may exit first when stopped) are reparented here, so
  // Stop() can wait for them and reap them.
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) return Internal("cannot become a child subreaper (prctl)");
  pid_t pid = fork();
  if (pid < 0) return Internal("fork failed");
  if (pid == 0) {
    setpgid(0, 0);
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  setpgid(pid, pid);  // also in the parent, so Stop() cannot race the child's setpgid
  pid_ = pid;
  return Status::Ok();
}

Status FleetProcess::WaitReady(const std::string& router_url, double timeout_s, int workers) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::string last = "no answer";
  while (std::chrono::steady_clock::now() < deadline) {
    int wstatus = 0;
    if (pid_ > 0 && waitpid(pid_, &wstatus, WNOHANG) == pid_) {
      pid_ = -1;
      return Unavailable("--fleet-cmd exited before the router was ready");
    }
    auto reply = HttpGet(router_url, "/ready", 1.0);
    if (reply.ok() && reply->status == 200) {
      if (workers <= 0) return Status::Ok();
      auto routable = RoutableWorkers(router_url);
      if (routable.ok() && *routable >= workers) return Status::Ok();
      last = routable.ok() ? std::to_string(*routable) + " of " + std::to_string(workers) + " workers routable"
                           : routable.status().message();
    } else {
      last = reply.ok() ? "HTTP " + std::to_string(reply->status) : reply.status().message();
    }
    std::this_thread::sleep_for(kPollPeriod);
  }
  return Unavailable("router at " + router_url + " not ready after " + std::to_string(timeout_s) + " s (" + last + ")");
}

Result<int> RoutableWorkers(const std::string& router_url) {
  auto reply = HttpGet(router_url, "/fleet", 1.0);
  if (!reply.ok()) return reply.status();
  const nlohmann::json fleet = nlohmann::json::parse(reply->body, nullptr, /*allow_exceptions=*/false);
  if (reply->status != 200 || !fleet.is_object() || !fleet.contains("workers") || !fleet["workers"].is_array()) {
    return Unavailable("no worker list from " + router_url + "/fleet");
  }
  int routable = 0;
  for (const nlohmann::json& w : fleet["workers"]) {
    if (w.is_object() && w.value("routable", false)) ++routable;
  }
  return routable;
}

void FleetProcess::Stop(double grace_s) {
  if (pid_ <= 0) return;
  kill(-pid_, SIGTERM);
  // Reaps what has exited of the group (its members are this process's children or, once
  // the shell is gone, its orphans) and says whether any member is left.
  auto group_left = [this] {
    int wstatus = 0;
    while (waitpid(-pid_, &wstatus, WNOHANG) > 0) {
    }
    return kill(-pid_, 0) == 0;
  };
  using Clock = std::chrono::steady_clock;
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace_s));
  while (group_left() && Clock::now() < deadline) std::this_thread::sleep_for(kStopPollPeriod);
  if (group_left()) {
    kill(-pid_, SIGKILL);
    // A member that is not this process's to reap (another reaper took it) stays a zombie
    // and would answer kill(0) for good: give up waiting after a second.
    const auto killed_by = Clock::now() + std::chrono::seconds(1);
    while (group_left() && Clock::now() < killed_by) std::this_thread::sleep_for(kStopPollPeriod);
  }
  pid_ = -1;
}

Result<HttpReply> HttpGet(const std::string& url, const std::string& path, double timeout_s) {
  namespace asio = boost::asio;
  namespace beast = boost::beast;
  namespace http = beast::http;
  constexpr std::string_view kScheme = "http://";
  if (url.rfind(kScheme, 0) != 0) return InvalidArgument("not an http:// URL: " + url);
  std::string hostport = url.substr(kScheme.size());
  std::string base;
  if (size_t slash = hostport.find('/'); slash != std::string::npos) {
    base = hostport.substr(slash);
    hostport.resize(slash);
    while (!base.empty() && base.back() == '/') base.pop_back();
  }
  std::string host = hostport, port = "80";
  if (size_t colon = hostport.rfind(':'); colon != std::string::npos) {
    host = hostport.substr(0, colon);
    port = hostport.substr(colon + 1);
  }
  asio::io_context io;
  beast::tcp_stream stream(io);
  beast::error_code ec;
  http::response<http::string_body> res;
  beast::flat_buffer buffer;
  http::request<http::empty_body> req{http::verb::get, base + path, 11};
  req.set(http::field::host, host);
  stream.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(timeout_s)));
  asio::ip::tcp::resolver resolver(io);
  auto endpoints = resolver.resolve(host, port, ec);
  if (ec) return Unavailable(ec.message());
  // Async with a deadline, run to completion here: a sync connect could hang.
  stream.async_connect(endpoints, [&](beast::error_code e, auto) {
    if (e) {
      ec = e;
      return;
    }
    http::async_write(stream, req, [&](beast::error_code e2, size_t) {
      if (e2) {
        ec = e2;
        return;
      }
      http::async_read(stream, buffer, res, [&](beast::error_code e3, size_t) { ec = e3; });
    });
  });
  io.run();
  if (ec) return Unavailable(ec.message());
  return HttpReply{static_cast<int>(res.result_int()), std::move(res.body())};
}

Result<std::string> OnlyModel(const std::string& router_url) {
  KVF_ASSIGN_OR_RETURN(HttpReply reply, HttpGet(router_url, "/v1/models", 5.0));
  if (reply.status != 200) {
    return Unavailable("GET /v1/models answered " + std::to_string(reply.status) + "; pass --model");
  }
  auto j = nlohmann::json::parse(reply.body, nullptr, /*allow_exceptions=*/false);
  std::vector<std::string> ids;
  if (j.is_object() && j.contains("data") && j["data"].is_array()) {
    for (const auto& m : j["data"]) {
      if (m.is_object() && m.contains("id") && m["id"].is_string()) ids.push_back(m["id"].get<std::string>());
    }
  }
  if (ids.size() == 1) return ids[0];
  std::string list;
  for (const auto& id : ids) list += (list.empty() ? "" : ", ") + id;
  return FailedPrecondition("the router serves " + std::to_string(ids.size()) + " models (" + list +
                            "); pass --model");
}

std::map<std::string, double> ParseRequestsByWorker(std::string_view text) {
  constexpr std::string_view kMetric = "kvfleet_router_requests_total{";
  constexpr std::string_view kWorker = "worker=\"";
  std::map<std::string, double> out;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    if (line.rfind(kMetric, 0) != 0) continue;
    size_t close = line.find('}');
    size_t w = line.find(kWorker);
    if (close == std::string_view::npos || w == std::string_view::npos || w > close) continue;
    size_t start = w + kWorker.size();
    size_t end = line.find('"', start);
    if (end == std::string_view::npos || end > close) continue;
    try {
      out[std::string(line.substr(start, end - start))] += std::stod(std::string(line.substr(close + 1)));
    } catch (const std::exception&) {
      // A malformed sample line: not ours to judge; skip it.
    }
  }
  return out;
}

double SumCounter(std::string_view text, std::string_view name, std::string_view label) {
  double sum = 0;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    const std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    if (line.rfind(name, 0) != 0 || line.size() <= name.size()) continue;
    std::string_view rest = line.substr(name.size());
    if (rest[0] == '{') {
      const size_t close = rest.find('}');
      if (close == std::string_view::npos) continue;
      if (!label.empty() && rest.substr(0, close).find(label) == std::string_view::npos) continue;
      rest = rest.substr(close + 1);
    } else if (rest[0] != ' ' || !label.empty()) {
      continue;  // another metric whose name starts with this one, or a sample without labels
    }
    try {
      sum += std::stod(std::string(rest));
    } catch (const std::exception&) {
      // A malformed sample line: skipped, as above.
    }
  }
  return sum;
}

Result<RouterCounters> ScrapeRouterCounters(const std::string& router_url) {
  KVF_ASSIGN_OR_RETURN(HttpReply reply, HttpGet(router_url, "/metrics", 5.0));
  if (reply.status != 200) return Unavailable("GET /metrics answered " + std::to_string(reply.status));
  return RouterCounters{ParseRequestsByWorker(reply.body), SumCounter(reply.body, "kvfleet_router_pulls_total"),
                        SumCounter(reply.body, "kvfleet_router_pulled_blocks_total"),
                        SumCounter(reply.body, "kvfleet_router_gossip_frames_total", "direction=\"sent\""),
                        SumCounter(reply.body, "kvfleet_router_gossip_sent_bytes_total")};
}

}  // namespace kvfleet::bench
