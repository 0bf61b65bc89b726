// Frame size limits: the largest message each kvfleet ZeroMQ socket accepts (ZMQ_MAXMSGSIZE),
// shared by the router and the worker. Each is derived from what its contract can
// legitimately carry (schema/README.md), so a peer that sends a bigger frame is broken or
// hostile: ZeroMQ drops its connection before the frame is buffered (a DISCONNECTED event
// on a monitored socket), and the frame is never delivered.
//
// Capnp sizes below are upper bounds per item: a struct's data words, its pointers, and a
// list's tag, rounded up to whole 8-byte words.
//
// Thread safety: constants.
#pragma once

#include <algorithm>
#include <cstdint>

#include "schema/sampling.h"

namespace kvfleet::wire::limits {

// Capnp framing, the segment table and the scalars of any message, with room to spare.
inline constexpr int64_t kSlackBytes = 64 * 1024;
// A short name: a worker's id (events::config::kMaxWorkerIdBytes), a model, an adapter.
inline constexpr int64_t kMaxNameBytes = 256;
// A path or endpoint (PATH_MAX): an adapter's base_model_name_or_path, a LoRA directory.
inline constexpr int64_t kMaxPathBytes = 4096;
// LoRA adapters one Hello lists; a worker holds them in host memory, so even 1,024 rank-64
// adapters of a 7B model take ~160 GB there.
inline constexpr int64_t kMaxLoraAdapters = 1024;
// KV pools one Hello lists: one per distinct attention window of the model (1 to 3 today).
inline constexpr int64_t kMaxKvPools = 64;
// The longest context a worker serves (max_context): 1 Mi tokens, the longest of today's
// long-context models. A Hello announcing more is refused; a prompt longer is refused.
inline constexpr int64_t kMaxContextTokens = int64_t{1} << 20;

// Hello (and a static worker's answer to Describe), Bye: every adapter with a name and a
// path-long base model plus three scalar words, every pool in 8 words, eight endpoints and
// names, and slack.
inline constexpr int64_t kMaxHelloBytes =
    kMaxLoraAdapters * (kMaxNameBytes + kMaxPathBytes + 32) + kMaxKvPools * 64 + 8 * kMaxPathBytes + kSlackBytes;

// Generate: the prompt's token ids (4 bytes each) of the longest context, and the rest of
// the request (sampling, stop strings, adapter name) within 1 MiB. LoadLora carries a path.
inline constexpr int64_t kMaxGenerateBytes = kMaxContextTokens * 4 + (int64_t{1} << 20);
// Every message a worker's request socket accepts (Generate, Cancel, Describe, LoRA controls).
inline constexpr int64_t kMaxToWorkerBytes = kMaxGenerateBytes;

// A TokenLogprob on the wire: token and logprob (1 word), the `top` list pointer (1 word),
// the list's tag (1 word); each top entry 2 words (token, logprob; its own tag shared).
inline constexpr int64_t kTokenLogprobBytes = 24 + int64_t{sampling::config::kMaxTopLogprobs} * 16;
// A Delta: the first one of a request can carry the logprobs of every prompt token with the
// most top entries (promptLogprobs); later ones carry one step's tokens.
inline constexpr int64_t kMaxDeltaBytes = kMaxContextTokens * kTokenLogprobBytes + kSlackBytes;
// Every message the router's DEALERs to a worker accept: Deltas, errors, LoRA results, and
// the answer to Describe (a Hello).
inline constexpr int64_t kMaxToRouterBytes = std::max(kMaxDeltaBytes, kMaxHelloBytes);

// The most routing blocks one worker caches, device and host tiers together: 4 Mi blocks
// (8 H200s' HBM plus 2 TB of host memory at 32-token blocks of a 70B model is ~1.5 Mi).
inline constexpr int64_t kMaxCacheBlocks = int64_t{1} << 22;
// A stored block on the wire: hash, lora id, tier and priority (3 words), its tokens pointer
// (1 word); tokens themselves only with include_tokens, which routers do not ask for.
inline constexpr int64_t kBlockEventBytes = 32;
// An EventBatch (one engine step), a snapshot chunk (config::kSnapshotBlocksPerMessage
// blocks) or a replay reply (a ring's batches, at most kReplayBatchesPerMessage): none
// describes more block changes than the largest cache, twice over (every block stored and
// removed).
inline constexpr int64_t kMaxEventMessageBytes = 2 * kMaxCacheBlocks * kBlockEventBytes + kSlackBytes;

// A ReplayRequest: three words in a one-segment message.
inline constexpr int64_t kMaxReplayRequestBytes = 4 * 1024;
// What a PUB socket receives: subscriptions ("kv." and a worker name).
inline constexpr int64_t kMaxSubscriptionBytes = 4 * 1024;
// What a worker's registration DEALER receives: nothing is sent to it; a frame is a broken peer.
inline constexpr int64_t kMaxRegistrationReplyBytes = 4 * 1024;

// Contract 4, KV transfer between workers. A PullReply frame (what a receiver's DEALER
// accepts): a holder splits a chain's blocks over frames of at most this, so 64 MiB holds a
// few blocks of the largest models (a 32-token bf16 block of a 405B model is ~16 MiB) while
// a receiver buffers no more per frame. A pool's block larger than a frame is refused tooLarge.
inline constexpr int64_t kMaxTransferBytes = int64_t{64} << 20;
// Blocks one PullRequest may ask for: the longest context in 16-token blocks.
inline constexpr int64_t kMaxPullBlocks = kMaxContextTokens / 16;
// A PullRequest (what a holder's ROUTER accepts): 8 bytes a hash, the namespace's names (a
// salt as long as a path) and the receiver's host id, 6 words a pool, and slack.
inline constexpr int64_t kMaxPullRequestBytes =
    kMaxPullBlocks * 8 + 3 * kMaxNameBytes + kMaxPathBytes + kMaxKvPools * 48 + kSlackBytes;

// Router gossip (schema/gossip.capnp, Contract 5). Workers one RouterGossip lists: the most
// a router knows at once (router/core/worker.h config::kMaxWorkers, --max-workers' bound).
inline constexpr int64_t kMaxGossipWorkers = 1024;
// Models one RouterGossip lists: each model is served by at least one worker.
inline constexpr int64_t kMaxGossipModels = kMaxGossipWorkers;
// A RouterGossip (what a router's gossip SUB accepts): a worker's entry is 3 data words, a
// name pointer, a name and its list tag; a model's 1 data word, a pointer, a name, a tag;
// the sender's name, and slack. About 640 KiB.
inline constexpr int64_t kMaxGossipBytes = kMaxGossipWorkers * (32 + kMaxNameBytes + 8) +
                                           kMaxGossipModels * (16 + kMaxNameBytes + 8) + kMaxNameBytes + kSlackBytes;

}  // namespace kvfleet::wire::limits
