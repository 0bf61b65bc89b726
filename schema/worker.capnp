# Requests between routers and workers: Contract 3 of docs/DESIGN.md.
# Append-only: never renumber, retype or reuse a field; add new fields at the end.
@0xcacafd8e046dc816;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("kvfleet::schema");

using Events = import "events.capnp";

# TensorRT-LLM KvCacheRetentionConfig: token ranges with a priority and an optional
# duration; earlier ranges win where they overlap.
struct RetentionRange {
  start @0 :UInt32;
  end @1 :UInt32;            # exclusive; used when hasEnd
  hasEnd @2 :Bool;           # false: to the end of the sequence
  priority @3 :UInt8;        # 0..100
  durationMs @4 :UInt64;     # used when hasDuration: then the block drops to the default priority
  hasDuration @5 :Bool;
}

struct Retention {
  ranges @0 :List(RetentionRange);
  decodePriority @1 :UInt8;  # for blocks filled during generation, when hasDecodePriority
  hasDecodePriority @2 :Bool;
  decodeDurationMs @3 :UInt64;
  hasDecodeDuration @4 :Bool;
}

struct Sampling {
  temperature @0 :Float32 = 1.0;  # 0 = greedy
  topP @1 :Float32 = 1.0;
  topK @2 :Int32 = 0;             # 0 = off
  seed @3 :UInt64;
  hasSeed @4 :Bool;
  maxTokens @5 :UInt32 = 16;
  stopTokenIds @6 :List(UInt32);
  ignoreEos @7 :Bool;
  n @8 :UInt32 = 1;               # sequences sampled from the prompt (OpenAI's n); Deltas carry their index
  # Logit processing, in this order (kernels/sampling.h): logitBias, repetitionPenalty,
  # frequency/presencePenalty, temperature, minP with topK, topP.
  presencePenalty @9 :Float32;    # OpenAI: minus this once for every token generated at least once
  frequencyPenalty @10 :Float32;    # OpenAI: minus this times the token's count in the generated tokens
  repetitionPenalty @11 :Float32 = 1.0;  # HF/vLLM, over prompt + generated: positive logits divided, negative multiplied; 1: off
  minP @12 :Float32;              # keep tokens with probability >= minP * the top probability; 0: off
  logitBias @13 :List(LogitBias); # at most 300 entries, distinct tokens
  logprobs @14 :Int8 = -1;        # -1: none; 0..20: the sampled token's logprob and this many top entries
  promptLogprobs @15 :Bool;       # also every prompt token's logprob (first: none), with `logprobs` top entries
  structured @16 :StructuredOutput;  # a constraint on the text; absent: none
}

# schema/sampling.h StructuredOutput.
struct StructuredOutput {
  kind @0 :Kind;
  spec @1 :Text;  # jsonSchema: the schema's JSON; regex: the pattern; choice: a JSON array of strings; ebnf: the grammar
  enum Kind { none @0; jsonSchema @1; jsonObject @2; regex @3; choice @4; ebnf @5; }
}

struct LogitBias {
  token @0 :UInt32;
  bias @1 :Float32;  # added to the raw logit, in [-100, 100]
}

# A token's log-probability under the model's raw logits (before bias, penalties and
# temperature, as OpenAI and vLLM report them), and the most likely tokens at that position.
struct TopLogprob {
  token @0 :UInt32;
  logprob @1 :Float32;
}

struct TokenLogprob {
  token @0 :UInt32;
  logprob @1 :Float32;
  top @2 :List(TopLogprob);  # descending logprob, lowest id first on ties
}

struct Generate {
  requestId @0 :UInt64;      # unique per router connection
  tokens @1 :List(UInt32);
  sampling @2 :Sampling;
  retention @3 :Retention;
  loraName @4 :Text;         # empty: none
  cacheSalt @5 :Text;        # empty: none
  model @6 :Text;            # empty: the worker's model
  pull @7 :PullHint;         # unset (empty source): compute what the worker does not hold
}

# Where a router expects the prompt's prefix to be cached: the worker pulls the blocks it
# lacks from that holder (Contract 4) while the request waits for its turn, and computes
# whatever the pull does not bring in time.
struct PullHint {
  source @0 :Text;      # the holder's Hello.transfer.endpoint; empty: no pull
  serverKey @1 :Text;   # the holder's Hello.transfer.publicKey (CURVE, Z85); empty: plain TCP
  blocks @2 :UInt32;    # leading prompt blocks (Contract 1's B) the holder is believed to hold
  workerId @3 :Text;    # the holder's workerId, for logs and metrics
  deadlineMs @4 :UInt32;  # give up the pull after this long (the router's prediction, doubled);
                          # 0: the worker's own bound. Capped by the worker's --transfer-deadline-ms
}

struct Cancel {
  requestId @0 :UInt64;
}

# LoRA adapters at run time (vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter):
# the worker answers each with one LoraResult of the same requestId.
struct LoadLora {
  requestId @0 :UInt64;
  name @1 :Text;      # the name requests use (their model field; Generate.loraName)
  path @2 :Text;      # a PEFT directory on the worker's filesystem
}

struct UnloadLora {
  requestId @0 :UInt64;
  name @1 :Text;
}

struct LoraResult {
  requestId @0 :UInt64;
  ok @1 :Bool;
  code @2 :ErrorCode;  # when not ok
  message @3 :Text;    # when not ok: why
}

struct Usage {
  promptTokens @0 :UInt32;
  cachedDeviceTokens @1 :UInt32;
  cachedHostTokens @2 :UInt32;
  completionTokens @3 :UInt32;
  timeToFirstTokenUs @4 :UInt64;  # measured inside the worker: request frame read (before its decode) -> first token handed to the socket
}

enum FinishReason {
  none @0;       # more deltas follow
  stop @1;       # EOS or a stop token id
  length @2;     # maxTokens or the context limit
  cancelled @3;
  error @4;
}

struct Delta {
  requestId @0 :UInt64;
  tokens @1 :List(UInt32);
  finishReason @2 :FinishReason;
  usage @3 :Usage;           # final counts once finishReason != none; running counts before
  index @4 :UInt32;          # the sequence (0..n-1) of a request of Sampling.n; its finishReason is that
                             # sequence's, and the request ends once all n have finished
  logprobs @5 :List(TokenLogprob);        # with Sampling.logprobs >= 0: one per token, in order
  promptLogprobs @6 :List(TokenLogprob);  # with promptLogprobs: prompt tokens 1.. (token 0 has none), in the first Delta only
}

enum ErrorCode {
  invalidRequest @0;
  contextTooLong @1;
  unknownLora @2;
  overloaded @3;       # queue full: retry elsewhere
  shuttingDown @4;
  internal @5;
  unknownModel @6;
}

struct Error {
  requestId @0 :UInt64;
  code @1 :ErrorCode;
  message @2 :Text;
}

struct Endpoints {
  requests @0 :Text;   # tcp://host:5556
  events @1 :Text;     # tcp://host:5557
  replay @2 :Text;     # tcp://host:5558
  http @3 :Text;       # http://host:9400
}

struct TierInfo {
  tier @0 :Events.Tier;
  totalBlocks @1 :UInt64;
}

# One KV pool of a worker (worker/kv: one per distinct attention window and kv heads).
struct KvPool {
  window @0 :UInt32;          # attention window in tokens; 0 = full attention (the events' windowSize)
  sinkTokens @1 :UInt32;      # StreamingLLM attention sinks the pool keeps
  denseContext @2 :Bool;      # StreamingLLM: position shift and a dense context phase
  attentionChunk @3 :UInt32;  # chunked attention in tokens; 0 = off
  layers @4 :UInt32;          # model layers in the pool
  deviceBlocks @5 :UInt64;
  hostBlocks @6 :UInt64;
  reuse @7 :Bool;             # the pool stores blocks for reuse (and publishes them)
  reuseTokens @8 :UInt32;     # with reuse: only blocks within a sequence's first reuseTokens
                              # tokens are stored (its first window or chunk); 0 = no limit
}

struct Hello {
  workerId @0 :Text;
  model @1 :Text;
  blockSize @2 :UInt32;
  maxContext @3 :UInt32;
  tiers @4 :List(TierInfo);
  endpoints @5 :Endpoints;
  backend @6 :Text;    # cpu, cuda or mock
  epoch @7 :UInt64;
  tokenizerDigest @8 :UInt64;  # common/tokenizer_files.h; 0: none (a mock, or no tokenizer.json)
  kvPools @9 :List(KvPool);    # empty: a worker older than the field (one full-attention pool assumed)
  kvBlockSize @10 :UInt32;     # tokens per KV block when smaller than blockSize (token-level KV: 1,
                               # events and hashing in blockSize-token groups); 0: blockSize
  loras @11 :List(LoraAdapter);  # the adapters the worker serves (device- or host-resident)
  maxLoras @12 :UInt32;        # adapters resident on the device at once; 0: no LoRA support
  loraLoadUs @13 :UInt64;      # time to make a host-resident adapter device-resident; 0: unknown
  tensorParallel @14 :UInt32;  # ranks (GPUs; the cpu backend's in-process ranks) the model is split
                               # over; 0: a worker older than the field (read as 1)
  transfer @15 :TransferInfo;  # KV transfer (Contract 4); unset: the worker serves no pulls
  prefillTokensPerSecond @16 :Float32;  # its expected prefill rate before it measures one (load
                                        # reports' then): its backend's cost model; 0: unknown
  role @17 :WorkerRole;        # what routers send it (P/D disaggregation); both from older workers
  structuredOutputs @18 :Bool; # it decodes under Generate.sampling's structured constraint
                               # (grammar/); false: routers send it no constrained request
  deviceId @19 :Text;          # the compute device (cuda: the GPU's UUID, cpu: host/cpu, --device-id);
                               # workers naming the same one share it; empty: not shared
}

# A worker's part in serving requests (kvfleet-worker --role). Routers split a long prompt's
# prefill from its decode: a prefill worker computes the prompt and serves its KV to a decode
# worker, which pulls it (Contract 4) and generates. `both` serves whole requests.
enum WorkerRole {
  both @0;
  prefill @1;   # only split prefills (Generate with maxTokens 1 whose token routers drop)
  decode @2;    # whole requests and the decode of split ones; never a split prefill
}

# How peers pull KV blocks from a worker (Contract 4, schema/transfer.capnp).
struct TransferInfo {
  endpoint @0 :Text;   # tcp://host:5559; empty: the worker serves no pulls
  publicKey @1 :Text;  # its CURVE server key (Z85); empty: plain TCP
  format @2 :Text;     # its KV block bytes: fp32, bf16, fp8e4m3 or none (mock); pulls need equal formats
  bytesPerBlock @3 :UInt64;  # bytes one block (blockSize tokens, every pool) moves: what a pull costs
  hostId @4 :Text;     # set when it copies device blocks with workers on its host (CUDA IPC): the host's boot id
}

# One LoRA adapter a worker serves over its base model.
struct LoraAdapter {
  name @0 :Text;        # requests select it by this name (their model field)
  loraId @1 :UInt64;    # Contract 1's LoraId(name): the events' loraId
  rank @2 :UInt32;
  baseModel @3 :Text;   # adapter_config.json's base_model_name_or_path, as written
}

# A router asks a worker it was given by address (--workers, --workers-dns), which sends it
# no Hello of its own, to describe itself: the worker answers FromWorker.hello on the same
# connection. Routers ask on connecting and every few seconds after.
struct Describe {}

# Router DEALER -> worker requests ROUTER: one frame.
struct ToWorker {
  union {
    generate @0 :Generate;
    cancel @1 :Cancel;
    loadLora @2 :LoadLora;
    unloadLora @3 :UnloadLora;
    describe @4 :Describe;
  }
}

# Worker requests ROUTER -> router DEALER: one frame.
struct FromWorker {
  union {
    delta @0 :Delta;
    error @1 :Error;
    loraResult @2 :LoraResult;
    hello @3 :Hello;  # the answer to a Describe: the Hello the worker would register with
  }
}

# A worker that shuts down cleanly says so, so routers stop sending to it at once.
struct Bye {
  workerId @0 :Text;
  epoch @1 :UInt64;
}

# Worker DEALER -> router registration ROUTER: one frame.
struct ToRouter {
  union {
    hello @0 :Hello;
    bye @1 :Bye;
  }
}
