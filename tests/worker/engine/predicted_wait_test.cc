// PredictedWaitSeconds: the prefill ahead at the measured rate, plus the wait for running
// requests to finish when the batch or the KV cache has no room for one more.
#include "worker/engine/predicted_wait.h"

#include <vector>

#include <doctest/doctest.h>

namespace kvfleet::engine {
namespace {

struct Queue {
  std::vector<uint32_t> waiting, running;
  QueueSnapshot snapshot;
  Queue() {
    snapshot.prefill_tokens_per_s = 10'000;
    snapshot.step_s = 0.010;
    snapshot.max_batch_size = 4;
    snapshot.block_size = 16;
    snapshot.free_blocks = 1000;
  }
  double Wait() {
    snapshot.waiting_tokens = waiting;
    snapshot.running_remaining = running;
    return PredictedWaitSeconds(snapshot);
  }
};

TEST_CASE("an idle worker predicts no wait") {
  Queue q;
  CHECK(q.Wait() == 0);
}

TEST_CASE("the prefill ahead counts at the measured rate, and not at all while the rate is unmeasured") {
  Queue q;
  q.snapshot.prefill_tokens = 5'000;  // e.g. two waiting prompts, and one running prefill's rest
  q.waiting = {2'000, 2'000};
  q.running = {10};
  CHECK(q.Wait() == doctest::Approx(0.5));
  q.snapshot.prefill_tokens_per_s = 0;
  CHECK(q.Wait() == 0);
}

TEST_CASE("a full batch: the newcomer waits for the running request with the least output left") {
  Queue q;
  q.running = {30, 7, 100, 12};  // max_batch_size 4
  CHECK(q.Wait() == doctest::Approx(7 * 0.010));
  // Two requests already wait for a slot: the third finish admits the newcomer.
  q.waiting = {1, 1};
  q.snapshot.prefill_tokens = 2;
  CHECK(q.Wait() == doctest::Approx(2.0 / 10'000 + 30 * 0.010));
}

TEST_CASE("prompts that do not fit the free KV blocks wait for finishes; admission stops at the first") {
  Queue q;
  q.running = {5, 50};
  q.snapshot.free_blocks = 10;  // 160 tokens
  // 100 tokens need 7 blocks (the sampled token's slot included) and fit; 100 more do not,
  // and the small one behind that waits too: admission is in order.
  q.waiting = {100, 100, 1};
  q.snapshot.prefill_tokens = 201;
  const double prefill = 201.0 / 10'000;
  // Two blocked and the newcomer: three finishes, more than the two running, so two rounds
  // of the longest.
  CHECK(q.Wait() == doctest::Approx(prefill + 2 * 50 * 0.010));
  q.waiting = {100, 100};
  q.snapshot.prefill_tokens = 200;
  CHECK(q.Wait() == doctest::Approx(200.0 / 10'000 + 50 * 0.010));  // the 2nd finish
  q.waiting = {100};
  q.snapshot.prefill_tokens = 100;
  CHECK(q.Wait() == doctest::Approx(100.0 / 10'000));  // 3 blocks left for the newcomer
}

TEST_CASE("more requests blocked than running: whole batches of the longest remaining output") {
  Queue q;
  q.snapshot.max_batch_size = 2;
  q.running = {4, 10};
  q.waiting = {1, 1, 1, 1};  // five finishes needed, two at a time: three rounds
  q.snapshot.prefill_tokens = 4;
  CHECK(q.Wait() == doctest::Approx(4.0 / 10'000 + 3 * 10 * 0.010));
}

TEST_CASE("a running prompt whose output ends at its first token frees its slot when its prefill ends") {
  Queue q;
  q.snapshot.max_batch_size = 2;
  // A prefill worker's requests: each samples one token, with its prompt's last chunk, so a
  // running prompt's remaining output after its prefill is 0 (engine.cc), and the prefill
  // term already counts the queue: no admission wait on top.
  q.running = {0, 0};
  q.waiting = {1'000, 1'000, 1'000, 1'000};
  q.snapshot.prefill_tokens = 5'000;
  CHECK(q.Wait() == doctest::Approx(0.5));
}

TEST_CASE("a pulled prompt admitted ahead waits for a slot only; one admitted in order waits like any") {
  Queue q;
  q.running = {30, 7, 100, 12};  // max_batch_size 4: full
  q.waiting = {1'000, 1'000};
  q.snapshot.prefill_tokens = 2'000;
  q.snapshot.waiting_tokens = q.waiting;
  q.snapshot.running_remaining = q.running;
  CHECK(PulledWaitSeconds(q.snapshot, true) == doctest::Approx(7 * 0.010));  // the first finish
  CHECK(PulledWaitSeconds(q.snapshot, false) == doctest::Approx(PredictedWaitSeconds(q.snapshot)));
  CHECK(PredictedWaitSeconds(q.snapshot) == doctest::Approx(0.2 + 30 * 0.010));  // the third finish
  q.running = {30, 7, 100};  // a slot free: admitted ahead at once, whatever waits
  q.snapshot.running_remaining = q.running;
  CHECK(PulledWaitSeconds(q.snapshot, true) == 0);
}

TEST_CASE("no step measured yet: no admission term") {
  Queue q;
  q.snapshot.step_s = 0;
  q.running = {3, 3, 3, 3};
  CHECK(q.Wait() == 0);
}

}  // namespace
}  // namespace kvfleet::engine
