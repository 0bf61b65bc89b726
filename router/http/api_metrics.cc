#include "router/http/api_metrics.h"

#include "common/http/metrics.h"

namespace kvfleet::router {

ApiMetrics::ApiMetrics(prometheus::Registry& r)
    : requests(prometheus::BuildCounter()
                   .Name("kvfleet_router_requests_total")
                   .Help("Completion requests answered, by model, worker and HTTP status")
                   .Register(r)),
      routing(prometheus::BuildHistogram()
                  .Name("kvfleet_router_routing_seconds")
                  .Help("Routing decision time, tokenization and block hashing included")
                  .Register(r)
                  .Add({}, prometheus::Histogram::BucketBoundaries{10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6,
                                                                   1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 100e-3})),
      matched(prometheus::BuildHistogram()
                  .Name("kvfleet_router_matched_blocks")
                  .Help("Leading prompt blocks the chosen worker was believed to hold")
                  .Register(r)
                  .Add({}, prometheus::Histogram::BucketBoundaries{0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512,
                                                                   1024})),
      cached(prometheus::BuildCounter()
                 .Name("kvfleet_router_cached_tokens_total")
                 .Help("Prompt tokens expected cached at routing (predicted) and reported cached by workers (actual)")
                 .Register(r)),
      predicted(cached.Add({{"kind", "predicted"}})),
      actual(cached.Add({{"kind", "actual"}})),
      ttft(prometheus::BuildHistogram()
               .Name("kvfleet_router_time_to_first_token_seconds")
               .Help("Time from the request's arrival to its first token, seen by the router")
               .Register(r)
               .Add({}, prometheus::Histogram::BucketBoundaries{1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3,
                                                                250e-3, 500e-3, 1, 2.5, 5, 10, 30})),
      itl(prometheus::BuildHistogram()
              .Name("kvfleet_router_inter_token_seconds")
              .Help("Time between successive deltas of a stream, per token")
              .Register(r)
              .Add({}, prometheus::Histogram::BucketBoundaries{1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3,
                                                               250e-3, 1})),
      refused(prometheus::BuildCounter()
                  .Name("kvfleet_router_requests_refused_total")
                  .Help("Completion requests refused for load (429 or 503), by model and reason: queue_full, "
                        "saturated, predicted_ttft, unattainable, no_worker, worker_queue_full")
                  .Register(r)),
      duration(prometheus::BuildHistogram()
                   .Name("kvfleet_router_request_duration_seconds")
                   .Help("Time from reading a completion request to queueing its answer's last byte, for "
                         "requests forwarded to a worker (errors included)")
                   .Register(r)
                   .Add({}, prometheus::Histogram::BucketBoundaries{10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1,
                                                                    2.5, 5, 10, 30, 60, 120, 300, 600})),
      queue_time(prometheus::BuildHistogram()
                     .Name("kvfleet_router_queue_time_seconds")
                     .Help("Time from reading a completion request to sending it to the worker that gave its "
                           "first token (parse, tokenize, route, and any attempt on a worker that failed first)")
                     .Register(r)
                     .Add({}, prometheus::Histogram::BucketBoundaries{100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3,
                                                                      10e-3, 25e-3, 100e-3, 1, 10, 60})),
      prompt_tokens(prometheus::BuildCounter()
                        .Name("kvfleet_router_prompt_tokens_total")
                        .Help("Prompt tokens of completion requests a worker answered, by model")
                        .Register(r)),
      generation_tokens(prometheus::BuildCounter()
                            .Name("kvfleet_router_generation_tokens_total")
                            .Help("Tokens generated for completion requests (streams cut short included), by model")
                            .Register(r)),
      unknown_fields(prometheus::BuildCounter()
                         .Name("kvfleet_router_unknown_fields_total")
                         .Help("Unknown request fields admitted by --allow-unknown-fields")
                         .Register(r)
                         .Add({})),
      pulls(prometheus::BuildCounter()
                .Name("kvfleet_router_pulls_total")
                .Help("Requests sent with a PullHint: the worker pulls the prefix it lacks from its holder")
                .Register(r)
                .Add({})),
      pulled_blocks(prometheus::BuildCounter()
                        .Name("kvfleet_router_pulled_blocks_total")
                        .Help("Prompt blocks those requests' workers were asked to pull")
                        .Register(r)
                        .Add({})),
      passed_over_blocks(prometheus::BuildCounter()
                             .Name("kvfleet_router_passed_over_blocks_total")
                             .Help("Prompt blocks another worker matched (held, or was computing) that the chosen "
                                   "worker neither held nor pulled: prefix reuse given up for load")
                             .Register(r)
                             .Add({})),
      pulls_of_computing(prometheus::BuildCounter()
                             .Name("kvfleet_router_pulls_of_computing_total")
                             .Help("Of those requests, the ones whose holder was still computing the prefix: it "
                                   "answers the pull once the blocks are stored")
                             .Register(r)
                             .Add({})),
      split(prometheus::BuildCounter()
                .Name("kvfleet_router_split_requests_total")
                .Help("Requests split between a prefill worker and a decode worker that pulls the prompt's KV")
                .Register(r)
                .Add({})),
      abandoned(prometheus::BuildCounter()
                    .Name("kvfleet_router_requests_abandoned_total")
                    .Help("Completions whose client closed the connection before the answer ended; their work on "
                          "the worker is cancelled and they are not in kvfleet_router_requests_total")
                    .Register(r)
                    .Add({})),
      ttft_coefficient(prometheus::BuildGauge()
                           .Name("kvfleet_router_ttft_coefficient")
                           .Help("The kv estimate's coefficient per term (queue, own prefill, step), fitted to the "
                                 "first tokens that came; 1 until calibrated, and with --no-ttft-calibration")
                           .Register(r)),
      coefficient_queue(ttft_coefficient.Add({{"term", "queue"}})),
      coefficient_own(ttft_coefficient.Add({{"term", "own"}})),
      coefficient_step(ttft_coefficient.Add({{"term", "step"}})),
      prefill_ttft_coefficient(prometheus::BuildGauge()
                                   .Name("kvfleet_router_prefill_ttft_coefficient")
                                   .Help("The kv estimate's coefficient per term for prefill-role workers, fitted to "
                                         "split requests' prefill stages; 1 until calibrated")
                                   .Register(r)),
      prefill_coefficient_queue(prefill_ttft_coefficient.Add({{"term", "queue"}})),
      prefill_coefficient_own(prefill_ttft_coefficient.Add({{"term", "own"}})),
      prefill_coefficient_step(prefill_ttft_coefficient.Add({{"term", "step"}})),
      pull_bias(prometheus::BuildGauge()
                    .Name("kvfleet_router_pull_bias_seconds")
                    .Help("Added to the kv estimate of a pull: how much later than estimated pulls' first tokens "
                          "came, beyond the other requests'; negative: sooner. 0 until 20 of each were seen")
                    .Register(r)
                    .Add({})) {
  http::RegisterBuildInfo(r);
  for (prometheus::Gauge* g : {&coefficient_queue, &coefficient_own, &coefficient_step, &prefill_coefficient_queue,
                               &prefill_coefficient_own, &prefill_coefficient_step}) {
    g->Set(1);
  }
}

void ApiMetrics::CountTokens(const std::string& model, uint32_t prompt, uint32_t generated) {
  prompt_tokens.Add({{"model", model}}).Increment(prompt);
  generation_tokens.Add({{"model", model}}).Increment(generated);
}

void ApiMetrics::CountRequest(const std::string& model, const std::string& worker, const std::string& status) {
  std::lock_guard<std::mutex> lock(series_mu_);
  prometheus::Counter& c = requests.Add({{"model", model}, {"worker", worker}, {"status", status}});
  c.Increment();
  series_[worker].insert(&c);
}

void ApiMetrics::ForgetWorker(const std::string& worker) {
  std::lock_guard<std::mutex> lock(series_mu_);
  auto it = series_.find(worker);
  if (it == series_.end()) return;
  for (prometheus::Counter* c : it->second) requests.Remove(c);
  series_.erase(it);
}

}  // namespace kvfleet::router
