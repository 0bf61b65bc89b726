// A fake worker for router tests: a ROUTER socket speaking Contract 3. It answers each
// Generate with `reply` one byte-token per delta (up to max_tokens); with n > 1, sequence i
// answers all but the last i bytes of it (finish length), the n interleaved. It reports as cached
// the longest block-aligned prefix it saw before, and records cancels. It can hang
// (never answer), stop after the first token, decode slowly, refuse (an Error with a code), end the request
// itself (a final Delta with finish error, after `hang_after` tokens), or close its socket (a
// crash, to the router). LoRA: it serves the adapters set_loras() names (a Generate for another
// is refused as unknown_lora), answers LoadLora (adding it) and UnloadLora (removing it, or
// unknown_lora) as its LoraMode says, and HelloOf() announces what it serves.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include <zmq.hpp>

#include "common/block_hash.h"
#include "common/clock.h"
#include "schema/registration.h"
#include "schema/requests.h"

namespace kvfleet::router::testing {

// Polls `pred` every 5 ms until it holds or `ms` pass; returns its last value.
template <typename Pred>
bool WaitFor(Pred pred, int ms = 5000) {
  for (int i = 0; i < ms / 5; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

// WaitFor for a fleet on a ManualClock: the fleet drains its sockets' connect events at its
// tick (20 ms on its clock), so while waiting the clock moves a tick every `polls_per_tick`
// polls (50 ms by default), at most `max_advance` in all (the test's next clock-driven event
// must lie beyond it).
template <typename Pred>
bool WaitTicking(ManualClock& clock, Pred pred, DurationNs max_advance, int ms = 10'000, int polls_per_tick = 10) {
  int polls = 0;
  DurationNs advanced = 0;
  return WaitFor([&] {
    if (pred()) return true;
    if (++polls % polls_per_tick == 0 && advanced < max_advance) {
      clock.Advance(20 * kNsPerMs);
      advanced += 20 * kNsPerMs;
    }
    return false;
  }, ms);
}

class FakeWorker {
 public:
  enum class Mode { kAnswer, kHang, kFirstTokenThenHang, kRefuse, kFail };
  // How it answers LoadLora: success, a refusal (invalid request, "bad adapter"), no answer.
  enum class LoraMode { kOk, kRefuse, kHang };

  explicit FakeWorker(std::string reply = "hello world", uint32_t block_size = 32)
      : reply_(std::move(reply)), block_size_(block_size), socket_(ctx_, zmq::socket_type::router) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.bind("tcp://127.0.0.1:*");
    endpoint_ = socket_.get(zmq::sockopt::last_endpoint);
    thread_ = std::thread([this] { Loop(); });
  }
  ~FakeWorker() { Crash(); }

  const std::string& endpoint() const { return endpoint_; }
  void set_mode(Mode m) { mode_ = m; }
  // Answers only the first `n` tokens of each request, then hangs (kFail: then fails it).
  void set_hang_after(uint32_t n) { hang_after_ = n; }
  // Waits this long before each token after the first (a worker still decoding), holding up
  // its other requests meanwhile.
  void set_token_delay(std::chrono::milliseconds d) { token_delay_ = d; }
  // kRefuse answers with this code.
  void set_refusal(WorkerErrorCode code) { refusal_ = code; }
  // Closes the socket: the router sees the connection drop.
  void Crash() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  int generates() const { return generates_.load(); }
  void set_loras(std::vector<std::string> names) {
    std::lock_guard<std::mutex> lock(mu_);
    loras_ = std::move(names);
  }
  std::vector<std::string> loras() {
    std::lock_guard<std::mutex> lock(mu_);
    return loras_;
  }
  void set_lora_mode(LoraMode m) { lora_mode_ = m; }
  int lora_controls() const { return lora_controls_.load(); }
  // A Hello for this worker: model `model`, block size 16, serving its adapters now.
  WorkerHello HelloOf(const std::string& name, const std::string& model = "llama", uint64_t lora_load_us = 0) {
    WorkerHello hello;
    hello.name = name;
    hello.model = model;
    hello.block_size = 16;
    hello.max_context = 2048;
    hello.requests_endpoint = endpoint_;
    hello.backend = "mock";
    hello.max_loras = 4;
    hello.lora_load_us = lora_load_us;
    for (const std::string& l : loras()) hello.loras.push_back(LoraAnnounce{l, LoraId(l), 8, model + "-hf"});
    return hello;
  }
  int cancels() const { return cancels_.load(); }
  GenerateParams last_params() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_;
  }

  // Sends Hello (or Bye) to a router's registration endpoint from a DEALER whose routing id
  // is the worker id it names, as a worker's (worker/server/registration.h); `routing_id`
  // overrides it (another peer).
  static void Register(const std::string& router_endpoint, const std::string& frame,
                       std::optional<std::string> routing_id = std::nullopt) {
    zmq::context_t ctx(1);
    zmq::socket_t s(ctx, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 2000);
    if (!routing_id) {
      auto decoded = DecodeToRouter(frame.data(), frame.size());
      if (decoded.ok()) {
        routing_id = std::visit([](const auto& m) { return m.name; }, *decoded);
      }
    }
    if (routing_id && !routing_id->empty()) s.set(zmq::sockopt::routing_id, *routing_id);
    s.connect(router_endpoint);
    s.send(zmq::buffer(frame), zmq::send_flags::none);
  }

 private:
  void Loop() {
    while (!stop_) {
      zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(10));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      zmq::message_t id, body;
      if (!socket_.recv(id) || !socket_.recv(body)) continue;
      auto msg = DecodeToWorker(body.data(), body.size());
      if (!msg.ok()) continue;
      if (msg->kind == ToWorkerMessage::Kind::kCancel) {
        ++cancels_;
        continue;
      }
      if (msg->kind == ToWorkerMessage::Kind::kLoadLora || msg->kind == ToWorkerMessage::Kind::kUnloadLora) {
        ++lora_controls_;
        if (lora_mode_ == LoraMode::kHang) continue;
        socket_.send(zmq::buffer(id.data(), id.size()), zmq::send_flags::sndmore);
        socket_.send(zmq::buffer(EncodeLoraResult(LoraControlResult(*msg))), zmq::send_flags::none);
        continue;
      }
      ++generates_;
      bool unknown_lora = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        last_ = msg->params;
        unknown_lora = !msg->params.lora.empty() &&
                       std::find(loras_.begin(), loras_.end(), msg->params.lora) == loras_.end();
      }
      if (unknown_lora) {
        socket_.send(zmq::buffer(id.data(), id.size()), zmq::send_flags::sndmore);
        socket_.send(zmq::buffer(EncodeError(WorkerError{msg->request_id, WorkerErrorCode::kUnknownLora,
                                                         "unknown LoRA adapter '" + msg->params.lora + "'"})),
                     zmq::send_flags::none);
        continue;
      }
      if (mode_ == Mode::kHang) continue;
      if (mode_ == Mode::kRefuse) {
        socket_.send(zmq::buffer(id.data(), id.size()), zmq::send_flags::sndmore);
        socket_.send(zmq::buffer(EncodeError(WorkerError{msg->request_id, refusal_.load(), "refused"})),
                     zmq::send_flags::none);
        continue;
      }
      uint32_t cached = CachedPrefix(msg->params.tokens);
      uint32_t n = std::min<uint32_t>(msg->params.sampling.max_tokens, static_cast<uint32_t>(reply_.size()));
      if (mode_ == Mode::kFirstTokenThenHang) n = std::min<uint32_t>(n, 1);
      const bool fails = mode_ == Mode::kFail;
      bool hangs = !fails && (mode_ != Mode::kAnswer || hang_after_ < n);
      n = std::min(n, hang_after_.load());
      if (fails) {  // the tokens before the failure, then a final Delta with finish error
        for (uint32_t i = 0; i <= n; ++i) {
          WorkerDelta d;
          d.request_id = msg->request_id;
          if (i < n) d.tokens = {static_cast<TokenId>(static_cast<unsigned char>(reply_[i]))};
          d.finish = i == n ? FinishReason::kError : FinishReason::kNone;
          socket_.send(zmq::buffer(id.data(), id.size()), zmq::send_flags::sndmore);
          socket_.send(zmq::buffer(EncodeDelta(d)), zmq::send_flags::none);
        }
        continue;
      }
      const uint32_t seqs = std::max(1u, msg->params.sampling.n);
      for (uint32_t i = 0; i < n; ++i) {
        if (i > 0 && token_delay_.load().count() > 0) std::this_thread::sleep_for(token_delay_.load());
        for (uint32_t s = 0; s < seqs; ++s) {
          const uint32_t len = std::max<uint32_t>(1, n - std::min(n - 1, s));  // sequence s: s fewer
          if (i >= len) continue;
          WorkerDelta d;
          d.request_id = msg->request_id;
          d.index = s;
          d.tokens = {static_cast<TokenId>(static_cast<unsigned char>(reply_[i]))};
          AddLogprobs(msg->params, i, s == 0, &d);
          bool last = i + 1 == len && !hangs;
          d.finish = last ? (len == reply_.size() ? FinishReason::kStop : FinishReason::kLength) : FinishReason::kNone;
          d.usage = {static_cast<uint32_t>(msg->params.tokens.size()), cached, 0, i + 1, 100};
          socket_.send(zmq::buffer(id.data(), id.size()), zmq::send_flags::sndmore);
          socket_.send(zmq::buffer(EncodeDelta(d)), zmq::send_flags::none);
        }
      }
    }
    socket_.close();
  }

  WorkerLoraResult LoraControlResult(const ToWorkerMessage& m) {
    WorkerLoraResult r;
    r.request_id = m.request_id;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find(loras_.begin(), loras_.end(), m.lora.name);
    if (m.kind == ToWorkerMessage::Kind::kLoadLora) {
      if (lora_mode_ == LoraMode::kRefuse) {
        r.code = WorkerErrorCode::kInvalidRequest;
        r.message = "bad adapter at " + m.lora.path;
        return r;
      }
      if (it == loras_.end()) loras_.push_back(m.lora.name);
    } else if (it == loras_.end()) {
      r.code = WorkerErrorCode::kUnknownLora;
      r.message = "no LoRA adapter '" + m.lora.name + "' is loaded";
      return r;
    } else {
      loras_.erase(it);
    }
    r.ok = true;
    return r;
  }

  // Logprobs when asked: token i of the reply at -(i + 1), top entries the token itself then
  // 'z', 'y', ... one lower each; prompt tokens (sequence 0's first delta) at -0.5 with the same tops.
  static TokenLogprob FakeLogprob(TokenId token, float logprob, int32_t top) {
    TokenLogprob lp{token, logprob, {}};
    for (int32_t k = 0; k < top; ++k) lp.top.emplace_back(k == 0 ? token : static_cast<TokenId>('z' + 1 - k), logprob - k);
    return lp;
  }
  static void AddLogprobs(const GenerateParams& p, uint32_t i, bool first_sequence, WorkerDelta* d) {
    if (p.sampling.logprobs < 0) return;
    d->logprobs.push_back(FakeLogprob(d->tokens[0], -1.0f - static_cast<float>(i), p.sampling.logprobs));
    if (i == 0 && first_sequence && p.sampling.prompt_logprobs) {
      for (size_t t = 1; t < p.tokens.size(); ++t) d->prompt_logprobs.push_back(FakeLogprob(p.tokens[t], -0.5f, p.sampling.logprobs));
    }
  }

  uint32_t CachedPrefix(const std::vector<TokenId>& tokens) {
    size_t best = 0;
    for (const auto& seen : seen_) {
      size_t i = 0;
      while (i < seen.size() && i < tokens.size() && seen[i] == tokens[i]) ++i;
      best = std::max(best, i);
    }
    seen_.push_back(tokens);
    return static_cast<uint32_t>(best / block_size_ * block_size_);
  }

  std::string reply_;
  uint32_t block_size_;
  zmq::context_t ctx_{1};
  zmq::socket_t socket_;
  std::string endpoint_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<Mode> mode_{Mode::kAnswer};
  std::atomic<uint32_t> hang_after_{~0u};
  std::atomic<std::chrono::milliseconds> token_delay_{std::chrono::milliseconds(0)};
  std::atomic<WorkerErrorCode> refusal_{WorkerErrorCode::kOverloaded};
  std::atomic<int> generates_{0};
  std::atomic<int> cancels_{0};
  std::atomic<int> lora_controls_{0};
  std::atomic<LoraMode> lora_mode_{LoraMode::kOk};
  std::vector<std::string> loras_;  // GUARDED_BY(mu_)
  std::mutex mu_;
  GenerateParams last_;
  std::vector<std::vector<TokenId>> seen_;  // worker thread only
};

}  // namespace kvfleet::router::testing
