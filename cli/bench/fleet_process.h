// A fleet that `kvfleet bench --compare --fleet-cmd CMD` starts before each run and stops
// after it, so that every policy starts from empty KV caches.
//
// CMD runs under /bin/sh in its own process group; Stop() signals the whole group
// (SIGTERM, then SIGKILL after a grace period) and returns once every process of the group
// is gone, so a `kvfleet up` and everything it started go down together, and the next
// fleet never starts beside the last one's workers still shutting down on the same ports.
// The shell may exit at the signal before what it started; this process is a child
// subreaper (PR_SET_CHILD_SUBREAPER, from Start), so those orphans are its to reap.
//
// Thread safety: thread-compatible; owned by the bench command.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <string_view>

#include "common/status.h"

namespace kvfleet::bench {

class FleetProcess {
 public:
  FleetProcess() = default;
  ~FleetProcess();  // Stop()s
  FleetProcess(const FleetProcess&) = delete;
  FleetProcess& operator=(const FleetProcess&) = delete;

  // Starts `command`. REQUIRES: not running.
  Status Start(const std::string& command);
  // Polls GET <router_url>/ready until it answers 200 and, when `workers` > 0, GET /fleet lists
  // that many routable workers; an error when the process exits or timeout_s passes first (a
  // fleet that lost workers at start would otherwise be measured as if whole).
  Status WaitReady(const std::string& router_url, double timeout_s, int workers = 0);
  // Stops the process group: SIGTERM, then SIGKILL to whatever is left of it after grace_s;
  // returns when the group is gone (or 1 s after the SIGKILL). Idempotent.
  void Stop(double grace_s = 10);
  bool running() const { return pid_ > 0; }

 private:
  pid_t pid_ = -1;
};

struct HttpReply {
  int status = 0;
  std::string body;
};
// GET <url><path> with a deadline; the reply, or why there was none.
Result<HttpReply> HttpGet(const std::string& url, const std::string& path, double timeout_s);

// Workers GET <router_url>/fleet lists as routable now; an error when it gives no such list.
Result<int> RoutableWorkers(const std::string& router_url);

// The router's only model, from GET /v1/models; an error when it serves none or several
// (then --model must choose).
Result<std::string> OnlyModel(const std::string& router_url);

// Requests per worker from Prometheus text: the sum over every other label of
// kvfleet_router_requests_total{worker="..."} (issue 7's router metric).
std::map<std::string, double> ParseRequestsByWorker(std::string_view metrics_text);

// The sum of every sample of counter `name` in Prometheus text, whatever its other labels, of
// those whose labels include `label` (e.g. `direction="sent"`; empty: every sample). 0: none.
double SumCounter(std::string_view metrics_text, std::string_view name, std::string_view label = {});

// What a run is read by from a router's /metrics, before and after it: requests per worker
// (ParseRequestsByWorker), and the requests sent with a pull hint and the blocks they named.
struct RouterCounters {
  std::map<std::string, double> requests_by_worker;
  double pulls = 0;          // kvfleet_router_pulls_total
  double pulled_blocks = 0;  // kvfleet_router_pulled_blocks_total
  double gossip_frames = 0;  // kvfleet_router_gossip_frames_total{direction="sent"}
  double gossip_bytes = 0;   // kvfleet_router_gossip_sent_bytes_total
};
Result<RouterCounters> ScrapeRouterCounters(const std::string& router_url);

}  // namespace kvfleet::bench
