// Workers started in the test's own process, on ephemeral loopback ports, and a bare
// Contract 3 client: the KV transfer tests of the cpu (tests/worker/server) and cuda
// (tests/gpu) backends run two of them side by side.
#pragma once

#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <capnp/message.h>
#include <zmq.hpp>

#include "schema/requests.h"
#include "schema/wire.h"
#include "schema/worker.capnp.h"
#include "tests/worker/server/loopback_worker_config.h"
#include "worker/server/worker.h"

namespace kvfleet::server::testing {

// A worker of `backend` over `model_dir` on ephemeral loopback ports, small enough that two
// share a machine (or a GPU): blocks of 16, 8 MiB of KV, a 512-token context.
inline WorkerConfig InProcessConfig(const std::string& backend, const std::string& model_dir) {
  WorkerConfig c = LoopbackWorkerConfig();
  c.backend = backend;
  c.model_dir = model_dir;
  c.block_size = 16;
  c.max_num_tokens = 256;
  c.max_batch_size = 4;
  c.max_context = 512;
  c.kv_cache_bytes = 8u << 20;
  return c;
}

// Started on construction, its engine thread running; stopped and joined on destruction.
struct RunningWorker {
  RunningWorker(const WorkerConfig& config, zmq::context_t& context) {
    auto started = Worker::Start(config, context);
    REQUIRE_MESSAGE(started.ok(), started.status().ToString());
    worker = std::move(*started);
    thread = std::thread([this] { worker->Run(); });
  }
  ~RunningWorker() {
    worker->RequestStop();
    thread.join();
  }
  std::unique_ptr<Worker> worker;
  std::thread thread;
};

// A greedy generation's answer.
struct Answer {
  std::vector<TokenId> tokens;
  uint32_t cached_device_tokens = 0;
  bool finished = false;
};

// A greedy Generate of 8 tokens (EOS ignored), with `hint` when it names a holder.
inline std::string GreedyGenerate(uint64_t id, const std::vector<TokenId>& prompt, const PullHint& hint) {
  capnp::MallocMessageBuilder msg;
  auto g = msg.initRoot<schema::ToWorker>().initGenerate();
  g.setRequestId(id);
  auto t = g.initTokens(static_cast<unsigned>(prompt.size()));
  for (size_t i = 0; i < prompt.size(); ++i) t.set(static_cast<unsigned>(i), prompt[i]);
  g.getSampling().setTemperature(0);
  g.getSampling().setMaxTokens(8);
  g.getSampling().setIgnoreEos(true);
  if (!hint.source.empty()) {
    auto h = g.initPull();
    h.setSource(hint.source);
    h.setServerKey(hint.server_key);
    h.setBlocks(hint.blocks);
    h.setWorkerId(hint.worker_id);
    h.setDeadlineMs(hint.deadline_ms);
  }
  return wire::Encode(msg);
}

// Sends each (prompt, hint) as request 1, 2, ... on one connection, in order, and collects
// the answers (a minute at most for all).
inline std::vector<Answer> AskAll(zmq::context_t& context, const std::string& endpoint,
                                  const std::vector<std::pair<std::vector<TokenId>, PullHint>>& asks) {
  zmq::socket_t s(context, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.connect(endpoint);
  for (size_t i = 0; i < asks.size(); ++i) {
    s.send(zmq::buffer(GreedyGenerate(i + 1, asks[i].first, asks[i].second)), zmq::send_flags::none);
  }
  std::vector<Answer> answers(asks.size());
  size_t finished = 0;
  while (finished < asks.size()) {
    zmq::pollitem_t item{static_cast<void*>(s), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::chrono::milliseconds(60'000)) != 1) break;
    zmq::message_t m;
    (void)s.recv(m, zmq::recv_flags::none);
    auto d = wire::Decode<schema::FromWorker>(m.data(), m.size());
    REQUIRE(d.ok());
    auto root = (*d)->Root<schema::FromWorker>();
    REQUIRE_MESSAGE(root.isDelta(), "the worker answered an error");
    auto delta = root.getDelta();
    REQUIRE((delta.getRequestId() >= 1 && delta.getRequestId() <= asks.size()));
    Answer& a = answers[delta.getRequestId() - 1];
    for (auto t : delta.getTokens()) a.tokens.push_back(t);
    if (delta.getFinishReason() != schema::FinishReason::NONE) {
      a.finished = true;
      a.cached_device_tokens = delta.getUsage().getCachedDeviceTokens();
      ++finished;
    }
  }
  return answers;
}

inline Answer Ask(zmq::context_t& context, const std::string& endpoint, const std::vector<TokenId>& prompt,
                  const PullHint& hint = {}) {
  return AskAll(context, endpoint, {{prompt, hint}})[0];
}

}  // namespace kvfleet::server::testing
