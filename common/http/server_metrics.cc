#include "common/http/server_metrics.h"

#include <cerrno>
#include <string>

namespace kvfleet::http {

ServerMetrics::ServerMetrics(std::shared_ptr<prometheus::Registry> registry)
    : registry_(registry ? std::move(registry) : std::make_shared<prometheus::Registry>()),
      accept_errors_(prometheus::BuildCounter()
                         .Name("kvfleet_http_accept_errors_total")
                         .Help("Failed accepts on the HTTP listener, by reason: emfile, enfile, enobufs, enomem "
                               "(each backs off before the next accept) and other")
                         .Register(*registry_)),
      refused_connections_(prometheus::BuildCounter()
                               .Name("kvfleet_http_connections_refused_total")
                               .Help("HTTP connections closed as accepted because max_connections were open")
                               .Register(*registry_)
                               .Add({})),
      open_connections_(prometheus::BuildGauge()
                            .Name("kvfleet_http_open_connections")
                            .Help("HTTP connections open")
                            .Register(*registry_)
                            .Add({})),
      slow_readers_(prometheus::BuildCounter()
                        .Name("kvfleet_http_slow_reader_closes_total")
                        .Help("HTTP connections closed because their client fell max_pending_write_bytes behind")
                        .Register(*registry_)
                        .Add({})),
      dropped_(prometheus::BuildCounter()
                   .Name("kvfleet_http_dropped_exchanges_total")
                   .Help("HTTP requests whose handler ended without answering while the client waited (each "
                         "answered 500: a bug to report)")
                   .Register(*registry_)
                   .Add({})),
      refused_requests_(prometheus::BuildCounter()
                            .Name("kvfleet_http_requests_refused_total")
                            .Help("HTTP requests the server answered itself before any handler (a malformed or "
                                  "ambiguous request, a body or header over its limit), by status")
                            .Register(*registry_)) {}

void ServerMetrics::CountAcceptError(const boost::system::error_code& ec) {
  const char* reason = "other";
  if (ec.category() == boost::system::system_category()) {
    switch (ec.value()) {
      case EMFILE: reason = "emfile"; break;
      case ENFILE: reason = "enfile"; break;
      case ENOBUFS: reason = "enobufs"; break;
      case ENOMEM: reason = "enomem"; break;
      default: break;
    }
  }
  accept_errors_.Add({{"reason", reason}}).Increment();
}

bool ServerMetrics::TryOpen(size_t cap) {
  size_t open = open_.load(std::memory_order_relaxed);
  do {
    if (open >= cap) {
      refused_connections_.Increment();
      return false;
    }
  } while (!open_.compare_exchange_weak(open, open + 1, std::memory_order_relaxed));
  open_connections_.Increment();
  return true;
}

void ServerMetrics::Closed() {
  open_.fetch_sub(1, std::memory_order_relaxed);
  open_connections_.Decrement();
}

void ServerMetrics::CountRefusedRequest(int status) {
  refused_requests_.Add({{"status", std::to_string(status)}}).Increment();
}

}  // namespace kvfleet::http
