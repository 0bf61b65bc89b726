// kvfleet events: what a worker says about its KV cache (Contract 2), as JSON lines.
//
//   kvfleet events --events tcp://w:5557 [--count N] [--duration S] [--heartbeats]
//   kvfleet events --replay tcp://w:5558 --snapshot [--events tcp://w:5557 --follow]
//
// Live mode subscribes to the worker's PUB socket and prints one line per batch; snapshot
// mode asks its replay socket for every block it holds (with each block's tier and
// retention priority), prints one line per reply message, and with --follow goes on with
// the live batches. 64-bit hashes, epochs and lora ids are 16 lowercase hex digits, as
// `kvfleet hash` prints them (JSON numbers lose precision past 2^53).
#include <cinttypes>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "cli/commands.h"
#include "common/curve_keys.h"
#include "schema/event_codec.h"

namespace kvfleet::cli {

namespace {

namespace config {
// How long a snapshot reply may go quiet between messages by default: a worker answers
// between engine steps, so seconds mean it is gone.
inline constexpr double kDefaultTimeoutS = 10;
// Poll granularity: how soon --duration ends a quiet stream.
inline constexpr int kPollMs = 100;
}  // namespace config

struct EventsArgs {
  std::string events;            // PUB endpoint
  std::string replay;            // replay ROUTER endpoint
  bool snapshot = false;
  bool follow = false;
  bool heartbeats = false;
  uint64_t count = 0;            // batches with events to print; 0 = no limit
  double duration_s = 0;         // 0 = no limit
  double timeout_s = config::kDefaultTimeoutS;  // --snapshot: silence before giving up
  std::string curve_keypair;     // this client's key pair file
  std::string curve_server_key;  // the worker's server public key file
};

std::string Hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

nlohmann::ordered_json EventJson(const kv::KvEvent& event) {
  nlohmann::ordered_json j = {{"id", event.id}, {"window", event.window_size}};
  std::visit(
      [&](const auto& e) {
        using T = std::decay_t<decltype(e)>;
        if constexpr (std::is_same_v<T, kv::StoredEvent>) {
          j["type"] = "stored";
          j["parent"] = Hex(e.parent_hash);
          nlohmann::ordered_json blocks = nlohmann::ordered_json::array();
          for (const kv::StoredBlock& b : e.blocks) {
            nlohmann::ordered_json jb = {{"hash", Hex(b.hash)}, {"tier", kv::TierName(b.tier)}, {"priority", b.priority},
                                 {"lora_id", Hex(b.lora_id)}};
            if (!b.tokens.empty()) jb["tokens"] = b.tokens;
            blocks.push_back(std::move(jb));
          }
          j["blocks"] = std::move(blocks);
        } else if constexpr (std::is_same_v<T, kv::RemovedEvent>) {
          j["type"] = "removed";
          j["tier"] = kv::TierName(e.tier);
          nlohmann::ordered_json hashes = nlohmann::ordered_json::array();
          for (BlockHash h : e.hashes) hashes.push_back(Hex(h));
          j["hashes"] = std::move(hashes);
        } else if constexpr (std::is_same_v<T, kv::UpdatedEvent>) {
          j["type"] = "updated";
          j["hash"] = Hex(e.hash);
          if (e.tier) j["tier"] = kv::TierName(*e.tier);
          if (e.priority) j["priority"] = *e.priority;
        } else if constexpr (std::is_same_v<T, kv::ClearedEvent>) {
          j["type"] = "cleared";
        } else {
          j["type"] = "created";
          j["blocks_per_tier"] = e.blocks_per_tier;
          j["block_size"] = e.block_size;
        }
      },
      event.data);
  return j;
}

nlohmann::ordered_json EventsJson(std::span<const kv::KvEvent> events) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const kv::KvEvent& e : events) out.push_back(EventJson(e));
  return out;
}

nlohmann::ordered_json BatchJson(const events::DecodedBatch& b) {
  const LoadReport& l = b.load;
  return {{"worker", b.header.worker_id},
          {"epoch", Hex(b.header.epoch)},
          {"seq", b.header.seq},
          {"created_ns", b.header.created_ns},
          {"events", EventsJson(b.events)},
          {"load",
           {{"active_requests", l.active_requests},
            {"queued_requests", l.queued_requests},
            {"active_prefill_tokens", l.active_prefill_tokens},
            {"active_decode_blocks", l.active_decode_blocks},
            {"free_blocks", l.free_blocks},
            {"total_blocks", l.total_blocks},
            {"prefill_tokens_per_second", l.prefill_tokens_per_second},
            {"decode_tokens_per_second", l.decode_tokens_per_second}}}};
}

void PrintLine(const nlohmann::ordered_json& j) {
  std::cout << j.dump() << '\n' << std::flush;  // a reader sees each line as it happens
}

Status Secure(zmq::socket_t& socket, const EventsArgs& args) {
  if (args.curve_keypair.empty()) return Status::Ok();
  KVF_ASSIGN_OR_RETURN(auto keys, LoadCurveKeyPair(args.curve_keypair));
  KVF_ASSIGN_OR_RETURN(auto server, LoadCurvePublicKey(args.curve_server_key));
  return MakeCurveClient(socket, keys, server);
}

// Where a snapshot stands: live batches of its epoch up to its seq are already in it.
struct SnapshotPoint {
  uint64_t epoch = 0;
  uint64_t seq = 0;
};

// Asks for a snapshot and prints its messages; the last one ends it.
Status PrintSnapshot(zmq::context_t& ctx, const EventsArgs& args, SnapshotPoint* point) {
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  KVF_RETURN_IF_ERROR(Secure(dealer, args));
  dealer.connect(args.replay);
  // No epoch known: the answer is a snapshot.
  const std::string bytes = events::EncodeReplayRequest({.epoch = 0, .from_seq = 0, .request_id = 1});
  dealer.send(zmq::buffer(bytes), zmq::send_flags::none);
  while (true) {
    zmq::pollitem_t item{dealer.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::chrono::milliseconds(static_cast<int64_t>(args.timeout_s * 1000))) == 0) {
      std::ostringstream msg;
      msg << "--replay " << args.replay << ": no snapshot reply within " << args.timeout_s << " s (--timeout)";
      return Unavailable(msg.str());
    }
    zmq::message_t m;
    (void)dealer.recv(m);
    auto reply = events::DecodeReplayReply(m.data(), m.size());
    if (!reply.ok()) return DataLoss("--replay " + args.replay + ": " + reply.status().message());
    if (const auto* error = std::get_if<events::ReplayError>(&reply->body))
      return Internal("--replay " + args.replay + ": the worker says: " + error->message);
    const auto* snap = std::get_if<events::SnapshotChunk>(&reply->body);
    if (snap == nullptr) return DataLoss("--replay " + args.replay + ": a replay reply that is not a snapshot");
    PrintLine({{"worker", reply->header.worker_id},
               {"epoch", Hex(reply->header.epoch)},
               {"snapshot",
                {{"consistent_seq", snap->consistent_seq},
                 {"consistent_event_id", snap->consistent_event_id},
                 {"last", reply->header.last}}},
               {"events", EventsJson(snap->events)}});
    if (reply->header.last) {
      *point = {reply->header.epoch, snap->consistent_seq};
      return Status::Ok();
    }
  }
}

zmq::socket_t Subscribe(zmq::context_t& ctx, const EventsArgs& args, Status* status) {
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::linger, 0);
  *status = Secure(sub, args);
  if (!status->ok()) return sub;
  sub.set(zmq::sockopt::subscribe, "kv.");
  sub.connect(args.events);
  return sub;
}

// Prints live batches until --count batches with events or --duration seconds, skipping
// those the snapshot at `after` already holds.
void PrintLive(zmq::socket_t& sub, const EventsArgs& args, SnapshotPoint after) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(args.duration_s);
  uint64_t printed = 0;
  while (args.count == 0 || printed < args.count) {
    if (args.duration_s > 0 && std::chrono::steady_clock::now() >= end) break;
    zmq::pollitem_t item{sub.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::chrono::milliseconds(config::kPollMs)) == 0) continue;
    std::vector<zmq::message_t> parts;
    (void)zmq::recv_multipart(sub, std::back_inserter(parts));
    if (parts.size() != 2) {
      std::cerr << "events: a message of " << parts.size() << " frames, not 2; skipped\n";
      continue;
    }
    auto batch = events::DecodeBatch(parts[1].data(), parts[1].size());
    if (!batch.ok()) {
      std::cerr << "events: a malformed batch from " << parts[0].to_string() << ": " << batch.status().message()
                << "; skipped\n";
      continue;
    }
    if (batch->header.epoch == after.epoch && batch->header.seq <= after.seq) continue;
    if (batch->events.empty() && !args.heartbeats) continue;
    PrintLine(BatchJson(*batch));
    if (!batch->events.empty()) ++printed;
  }
}

int RunEvents(const EventsArgs& args) {
  auto fail = [](const std::string& message) {
    std::cerr << "error: " << message << "\n";
    return 2;
  };
  if (args.snapshot && args.replay.empty()) return fail("--snapshot needs --replay (the worker's replay endpoint)");
  if (!args.snapshot && args.events.empty()) return fail("give --events (live batches) or --replay with --snapshot");
  if (args.follow && (!args.snapshot || args.events.empty()))
    return fail("--follow goes with --snapshot and --events: the snapshot, then the live batches");
  if (args.curve_keypair.empty() != args.curve_server_key.empty())
    return fail("--curve-keypair and --curve-server-key go together");
  if (!(args.duration_s >= 0)) return fail("--duration must be >= 0");
  if (!(args.timeout_s > 0)) return fail("--timeout must be > 0");
  zmq::context_t ctx(1);
  try {
    // Subscribed before the snapshot is asked for, so no batch after it is missed.
    Status status;
    zmq::socket_t sub;
    if (!args.events.empty()) {
      sub = Subscribe(ctx, args, &status);
      if (!status.ok()) return fail(status.message());
    }
    SnapshotPoint point;
    if (args.snapshot) {
      if (Status s = PrintSnapshot(ctx, args, &point); !s.ok()) return fail(s.message());
      if (!args.follow) return 0;
    }
    PrintLive(sub, args, point);
  } catch (const zmq::error_t& e) {
    return fail(std::string("zmq: ") + e.what() + " (check --events / --replay)");
  }
  return 0;
}

}  // namespace

Action AddEventsCommand(CLI::App& parent) {
  auto args = std::make_shared<EventsArgs>();
  CLI::App* cmd = parent.add_subcommand(
      "events", "print a worker's KV events (and with --snapshot every block it holds) as JSON lines");
  cmd->add_option("--events", args->events, "the worker's events PUB endpoint, e.g. tcp://host:5557");
  cmd->add_option("--replay", args->replay, "the worker's replay endpoint, e.g. tcp://host:5558 (for --snapshot)");
  cmd->add_flag("--snapshot", args->snapshot, "print every block the worker holds (tier, priority), then stop");
  cmd->add_flag("--follow", args->follow, "with --snapshot: go on with the live batches from --events");
  cmd->add_flag("--heartbeats", args->heartbeats, "print heartbeats (batches with no events) too");
  cmd->add_option("--count", args->count, "stop after this many batches with events (0: no limit)")
      ->capture_default_str();
  cmd->add_option("--duration", args->duration_s, "stop after this many seconds (0: no limit)")->capture_default_str();
  cmd->add_option("--timeout", args->timeout_s, "--snapshot: seconds of silence before giving up")
      ->capture_default_str();
  cmd->add_option("--curve-keypair", args->curve_keypair, "CURVE: this client's key pair file (kvfleet keygen)");
  cmd->add_option("--curve-server-key", args->curve_server_key, "CURVE: the worker's server public key file");
  return [args]() { return RunEvents(*args); };
}

}  // namespace kvfleet::cli
