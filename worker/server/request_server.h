// RequestServer: the worker's requests ROUTER socket (Contract 3 of docs/DESIGN.md).
//
// Routers connect DEALER sockets and send one ToWorker frame (after the identity frame
// ZMQ adds): Generate, Cancel, LoadLora, UnloadLora or Describe. The worker answers with
// FromWorker frames: a stream of Deltas per request, or one Error; one LoraResult per LoRA
// control; its Hello (SetHello) to a Describe, from the I/O thread, with no engine involved.
// LoadLora reads the adapter from disk on a loader thread of its own (an 8B model's
// adapter takes a while), so neither the socket nor the engine waits; the engine thread
// gets a LoadLoraCommand holding the adapter (or why it could not be read). A frame that does not decode is answered with an
// Error when its request id can be read, and logged otherwise; the server stays up.
//
// One I/O thread owns the socket. It decodes what arrives into Commands for the engine
// thread (Poll/Wait), and encodes what the engine thread hands to Send*/SendError. Wire
// request ids are unique per router connection only, so a request is named by its
// ClientKey (connection identity, wire id).
//
// Thread safety: thread-safe. Every public method may be called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include <zmq.hpp>

#include "common/clock.h"
#include "common/curve_keys.h"
#include "common/status.h"
#include "schema/requests.h"
#include "worker/engine/request.h"
#include "worker/engine/structured_output.h"
#include "worker/model/lora_adapter.h"

namespace kvfleet::server {

// Who asked: the ROUTER identity of the router's connection, and its request id.
struct ClientKey {
  std::string identity;
  uint64_t request_id = 0;
  bool operator==(const ClientKey&) const = default;
};

struct ClientKeyHash {
  size_t operator()(const ClientKey& k) const;
};

// The wire code for an engine Status (see engine::ValidateRequest for the mapping).
WorkerErrorCode ErrorCodeFor(const Status& status);

struct GenerateCommand {
  ClientKey key;
  std::string model;  // empty: the worker's model
  engine::GenerateRequest request;
  TimeNs arrival = 0;  // when the frame was read off the socket, before its decode
  PullHint pull;       // Contract 3's PullHint: where the prompt's prefix is cached; empty: none
};

struct CancelCommand {
  ClientKey key;
};

// An adapter read from disk (by the LoraLoader, on the loader thread), for the engine to
// register; `status` says why there is none.
struct LoadLoraCommand {
  ClientKey key;
  std::string name;
  std::string path;  // the adapter's directory on this machine
  std::shared_ptr<const model::LoraAdapter> adapter;
  Status status;
};

struct UnloadLoraCommand {
  ClientKey key;
  std::string name;
};

using Command = std::variant<GenerateCommand, CancelCommand, LoadLoraCommand, UnloadLoraCommand>;

// Reads adapter `name` from directory `path` and checks it against the served model.
using LoraLoader =
    std::function<Result<std::shared_ptr<const model::LoraAdapter>>(const std::string& name, const std::string& path)>;

// CURVE on the requests socket, with common/curve_keys.h's files (all optional).
struct RequestServerCurve {
  std::string server_keypair_file;   // empty = plaintext
  std::string authorized_keys_file;  // empty = any client with the server key may connect
};

struct RequestServerOptions {
  std::string endpoint = "tcp://*:5556";  // where the ROUTER binds
  RequestServerCurve curve;
  // Outgoing frames queued for one peer before ZMQ drops more (ZMQ_SNDHWM).
  int send_high_water_mark = 100'000;
  // Called with each request's time to first token as its first token is handed to the
  // socket: the figure its Deltas report (StampTimeToFirstToken). On the I/O thread.
  std::function<void(DurationNs)> on_first_token;
  // Called with the code of each Error sent instead of a stream (a refusal: a full queue, a
  // shutdown, a bad request). On the thread that calls SendError.
  std::function<void(WorkerErrorCode)> on_error;
};

class RequestServer {
 public:
  // Binds the socket and starts the I/O thread. `clock` stamps arrivals.
  static Result<std::unique_ptr<RequestServer>> Start(zmq::context_t& context, const RequestServerOptions& options,
                                                      const Clock* clock);
  ~RequestServer();  // Stop()s
  RequestServer(const RequestServer&) = delete;
  RequestServer& operator=(const RequestServer&) = delete;

  // The endpoint actually bound (resolves "tcp://*:0" to its port).
  const std::string& bound_endpoint() const { return bound_endpoint_; }

  // Takes every command received so far, oldest first; waits up to `timeout` for one when
  // there is none (0: do not wait). Returns early on Wake().
  std::vector<Command> Take(DurationNs timeout);
  // Makes a Take() that is waiting return now.
  void Wake();

  // Queues a Delta (or an Error) for the I/O thread to send.
  void SendOutput(const ClientKey& key, const engine::RequestOutput& output);
  void SendError(const ClientKey& key, WorkerErrorCode code, const std::string& message);
  // Queues the answer to a LoadLora or UnloadLora (its request_id is the key's).
  void SendLoraResult(const ClientKey& key, const Status& status);

  // Sets the Hello a Describe is answered with (schema/describe.h). Until it is set (the
  // model is loading) a Describe goes unanswered: the router asks again. Any thread.
  void SetHello(const WorkerHello& hello);

  // Sets how LoadLora reads adapters (before it is set, LoadLora is refused: the worker is
  // starting). Called on any thread.
  void SetLoraLoader(LoraLoader loader);

  // Constrained decoding: a Generate whose sampling asks for a structured output is compiled
  // here, on the I/O thread, as it is decoded (StructuredOutputs::Prepare), and refused with
  // invalidRequest when its spec does not compile. Unset: such requests reach the engine
  // without a grammar, which refuses them. Called once, on any thread, before the Hello.
  void SetStructuredOutputs(std::shared_ptr<engine::StructuredOutputs> structured);

  // Sends what is queued, then stops the I/O thread and closes the socket. Idempotent.
  void Stop();

  // Frames received that did not decode as ToWorker.
  uint64_t malformed_frames() const { return malformed_.load(std::memory_order_relaxed); }

 private:
  RequestServer(zmq::context_t& context, std::unique_ptr<zmq::context_t> own_context, const Clock* clock,
                std::function<void(DurationNs)> on_first_token, std::function<void(WorkerErrorCode)> on_error);
  void IoLoop();
  void LoaderLoop();
  // `received`: when the frame was read off the socket.
  void HandleFrame(const std::string& identity, const zmq::message_t& frame, TimeNs received);
  void FlushOutbox();
  // Sends the Hello frame to `identity`. REQUIRES: the I/O thread.
  void AnswerDescribe(const std::string& identity);
  // Sets out->usage.time_to_first_token to the worker's whole time to first token: from the
  // request frame's read off the socket to the moment its first token is handed to the socket
  // (now), not only to the engine step that produced it. Every later Delta of the request
  // repeats that value. Reports it to options.on_first_token once.
  // REQUIRES: the I/O thread.
  void StampTimeToFirstToken(const ClientKey& key, TimeNs queued_at, engine::RequestOutput* out);

  // With authorized keys the socket lives in a context of its own, whose ZAP handler
  // (one per context) admits them; the process's other workers keep the shared one.
  std::unique_ptr<zmq::context_t> own_context_;
  std::unique_ptr<ZapAuthenticator> zap_;
  const Clock* clock_;
  const std::function<void(DurationNs)> on_first_token_;
  const std::function<void(WorkerErrorCode)> on_error_;
  zmq::socket_t socket_;  // used by the I/O thread only, after Start()
  std::string bound_endpoint_;
  int wake_fd_ = -1;      // eventfd: the I/O thread wakes when the outbox fills or on Stop
  std::thread io_thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> malformed_{0};

  std::mutex inbox_mu_;
  std::condition_variable inbox_cv_;
  std::vector<Command> inbox_;  // GUARDED_BY(inbox_mu_)
  bool inbox_woken_ = false;    // GUARDED_BY(inbox_mu_)

  struct ErrorReply {
    WorkerErrorCode code;
    std::string message;
  };
  // Encoded on the I/O thread, so the engine thread only copies tokens.
  struct Outgoing {
    ClientKey key;
    std::variant<engine::RequestOutput, ErrorReply, WorkerLoraResult> body;
    TimeNs queued_at = 0;  // when SendOutput/SendError queued it (clock_)
  };
  // LoadLora jobs for the loader thread.
  std::thread loader_thread_;
  std::mutex loader_mu_;
  std::condition_variable loader_cv_;
  LoraLoader loader_;                       // GUARDED_BY(loader_mu_)
  std::deque<LoadLoraCommand> loader_jobs_;  // GUARDED_BY(loader_mu_); adapters not yet read
  bool loader_stop_ = false;                // GUARDED_BY(loader_mu_)

  std::mutex structured_mu_;
  std::shared_ptr<engine::StructuredOutputs> structured_;  // GUARDED_BY(structured_mu_)
  std::mutex hello_mu_;
  std::string hello_frame_;  // GUARDED_BY(hello_mu_); EncodeDescribed, empty until SetHello

  std::mutex outbox_mu_;
  std::vector<Outgoing> outbox_;  // GUARDED_BY(outbox_mu_)
  // Requests whose first token has left, with the time to first token their Deltas report;
  // erased with the request's last Delta. I/O thread only.
  std::unordered_map<ClientKey, DurationNs, ClientKeyHash> first_token_sent_;
};

}  // namespace kvfleet::server
