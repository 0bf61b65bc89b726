#include "schema/registration.h"
#include "schema/describe.h"

#include <cmath>

#include <capnp/message.h>

#include "schema/limits.h"
#include "schema/wire.h"
#include "schema/worker.capnp.h"

namespace kvfleet {

namespace {

void FillHello(const WorkerHello& h, schema::Hello::Builder out) {
  out.setWorkerId(wire::AsText(h.name));
  out.setModel(wire::AsText(h.model));
  out.setBlockSize(h.block_size);
  out.setMaxContext(h.max_context);
  auto tiers = out.initTiers(h.host_blocks > 0 ? 2 : 1);
  tiers[0].setTier(schema::Tier::DEVICE);
  tiers[0].setTotalBlocks(h.device_blocks);
  if (h.host_blocks > 0) {
    tiers[1].setTier(schema::Tier::HOST);
    tiers[1].setTotalBlocks(h.host_blocks);
  }
  auto e = out.initEndpoints();
  e.setRequests(wire::AsText(h.requests_endpoint));
  e.setEvents(wire::AsText(h.events_endpoint));
  e.setReplay(wire::AsText(h.replay_endpoint));
  e.setHttp(wire::AsText(h.http_endpoint));
  out.setBackend(wire::AsText(h.backend));
  out.setEpoch(h.epoch);
  out.setTokenizerDigest(h.tokenizer_digest);
  out.setKvBlockSize(h.kv_block_size);
  auto pools = out.initKvPools(static_cast<unsigned>(h.kv_pools.size()));
  for (unsigned i = 0; i < h.kv_pools.size(); ++i) {
    const KvPoolAnnounce& p = h.kv_pools[i];
    auto w = pools[i];
    w.setWindow(p.window);
    w.setSinkTokens(p.sink_tokens);
    w.setDenseContext(p.dense_context);
    w.setAttentionChunk(p.attention_chunk);
    w.setLayers(p.layers);
    w.setDeviceBlocks(p.device_blocks);
    w.setHostBlocks(p.host_blocks);
    w.setReuse(p.reuse);
    w.setReuseTokens(p.reuse_tokens);
  }
  auto loras = out.initLoras(static_cast<unsigned>(h.loras.size()));
  for (unsigned i = 0; i < h.loras.size(); ++i) {
    loras[i].setName(wire::AsText(h.loras[i].name));
    loras[i].setLoraId(h.loras[i].lora_id);
    loras[i].setRank(h.loras[i].rank);
    loras[i].setBaseModel(wire::AsText(h.loras[i].base_model));
  }
  out.setMaxLoras(h.max_loras);
  out.setLoraLoadUs(h.lora_load_us);
  out.setTensorParallel(h.tensor_parallel);
  out.setPrefillTokensPerSecond(h.prefill_tokens_per_second);
  out.setRole(static_cast<schema::WorkerRole>(static_cast<uint16_t>(h.role)));
  out.setStructuredOutputs(h.structured_outputs);
  out.setDeviceId(wire::AsText(h.device_id));
  if (!h.transfer_endpoint.empty()) {
    auto t = out.initTransfer();
    t.setEndpoint(wire::AsText(h.transfer_endpoint));
    t.setPublicKey(wire::AsText(h.transfer_key));
    t.setFormat(wire::AsText(h.transfer_format));
    t.setBytesPerBlock(h.transfer_bytes_per_block);
    t.setHostId(wire::AsText(h.transfer_host_id));
  }
}

// A Hello's tiers: one per cache tier, device and host today; room for tiers a newer worker adds.
constexpr uint64_t kMaxTiers = 16;

Result<WorkerHello> ReadHello(schema::Hello::Reader h) {
  WorkerHello out;
  KVF_RETURN_IF_ERROR(wire::CheckCount(h.getTiers(), kMaxTiers, "tiers"));
  KVF_RETURN_IF_ERROR(wire::CheckCount(h.getKvPools(), wire::limits::kMaxKvPools, "kv pools"));
  KVF_RETURN_IF_ERROR(wire::CheckCount(h.getLoras(), wire::limits::kMaxLoraAdapters, "lora adapters"));
  out.name = wire::FromText(h.getWorkerId());
  out.model = wire::FromText(h.getModel());
  out.block_size = h.getBlockSize();
  out.max_context = h.getMaxContext();
  for (auto t : h.getTiers()) {
    if (t.getTier() == schema::Tier::DEVICE) out.device_blocks = t.getTotalBlocks();
    else out.host_blocks += t.getTotalBlocks();
  }
  auto e = h.getEndpoints();
  out.requests_endpoint = wire::FromText(e.getRequests());
  out.events_endpoint = wire::FromText(e.getEvents());
  out.replay_endpoint = wire::FromText(e.getReplay());
  out.http_endpoint = wire::FromText(e.getHttp());
  out.backend = wire::FromText(h.getBackend());
  out.epoch = h.getEpoch();
  out.tokenizer_digest = h.getTokenizerDigest();
  out.kv_block_size = h.getKvBlockSize();
  for (auto p : h.getKvPools()) {
    out.kv_pools.push_back(KvPoolAnnounce{p.getWindow(), p.getSinkTokens(), p.getDenseContext(),
                                          p.getAttentionChunk(), p.getLayers(), p.getDeviceBlocks(),
                                          p.getHostBlocks(), p.getReuse(), p.getReuseTokens()});
  }
  for (auto l : h.getLoras()) {
    out.loras.push_back(LoraAnnounce{wire::FromText(l.getName()), l.getLoraId(), l.getRank(), wire::FromText(l.getBaseModel())});
  }
  out.max_loras = h.getMaxLoras();
  out.lora_load_us = h.getLoraLoadUs();
  out.tensor_parallel = h.getTensorParallel() == 0 ? 1 : h.getTensorParallel();  // 0: older than the field
  const float rate = h.getPrefillTokensPerSecond();
  out.prefill_tokens_per_second = std::isfinite(rate) && rate > 0 ? rate : 0;  // never trusted past sense
  switch (h.getRole()) {  // an enumerant newer than this router reads as both
    case schema::WorkerRole::PREFILL: out.role = WorkerRole::kPrefill; break;
    case schema::WorkerRole::DECODE: out.role = WorkerRole::kDecode; break;
    default: out.role = WorkerRole::kBoth; break;
  }
  out.structured_outputs = h.getStructuredOutputs();
  out.device_id = wire::FromText(h.getDeviceId());
  if (h.hasTransfer()) {
    auto t = h.getTransfer();
    out.transfer_endpoint = wire::FromText(t.getEndpoint());
    out.transfer_key = wire::FromText(t.getPublicKey());
    out.transfer_format = wire::FromText(t.getFormat());
    out.transfer_bytes_per_block = t.getBytesPerBlock();
    out.transfer_host_id = wire::FromText(t.getHostId());
  }
  return out;
}

}  // namespace

std::string_view WorkerRoleName(WorkerRole role) {
  switch (role) {
    case WorkerRole::kPrefill: return "prefill";
    case WorkerRole::kDecode: return "decode";
    case WorkerRole::kBoth: break;
  }
  return "both";
}

Result<WorkerRole> ParseWorkerRole(std::string_view name) {
  for (WorkerRole r : {WorkerRole::kBoth, WorkerRole::kPrefill, WorkerRole::kDecode}) {
    if (name == WorkerRoleName(r)) return r;
  }
  return InvalidArgument("unknown worker role '" + std::string(name) + "': expected prefill, decode or both");
}

std::string EncodeHello(const WorkerHello& h) {
  capnp::MallocMessageBuilder message;
  FillHello(h, message.initRoot<schema::ToRouter>().initHello());
  return wire::Encode(message);
}

std::string EncodeDescribe() {
  capnp::MallocMessageBuilder message;
  message.initRoot<schema::ToWorker>().initDescribe();
  return wire::Encode(message);
}

std::string EncodeDescribed(const WorkerHello& hello) {
  capnp::MallocMessageBuilder message;
  FillHello(hello, message.initRoot<schema::FromWorker>().initHello());
  return wire::Encode(message);
}

bool IsDescribe(const void* data, size_t size) {
  auto decoded = wire::Decode<schema::ToWorker>(data, size);
  if (!decoded.ok()) return false;
  try {
    return (*decoded)->Root<schema::ToWorker>().isDescribe();
  } catch (const kj::Exception&) {
    return false;
  }
}

Result<WorkerHello> DecodeDescribed(const void* data, size_t size) {
  auto decoded = wire::Decode<schema::FromWorker>(data, size);
  if (!decoded.ok()) return decoded.status();
  try {
    auto root = (*decoded)->Root<schema::FromWorker>();
    if (!root.isHello()) return DataLoss("FromWorker is not a Hello");
    return ReadHello(root.getHello());
  } catch (const kj::Exception& e) {
    return DataLoss(std::string("malformed message: ") + e.getDescription().cStr());
  }
}

static const KvPoolAnnounce* IndexedPool(const WorkerHello& hello) {
  const KvPoolAnnounce* best = nullptr;
  // A pool's stored prefix in tokens, "no limit" last.
  auto stored = [](const KvPoolAnnounce& p) { return p.reuse_tokens == 0 ? UINT64_MAX : uint64_t{p.reuse_tokens}; };
  for (const KvPoolAnnounce& p : hello.kv_pools) {
    if (!p.reuse) continue;
    if (best == nullptr || stored(p) < stored(*best) || (stored(p) == stored(*best) && p.window < best->window)) {
      best = &p;
    }
  }
  return best;
}

uint32_t IndexedWindow(const WorkerHello& hello) {
  const KvPoolAnnounce* pool = IndexedPool(hello);
  return pool == nullptr ? 0 : pool->window;
}

uint32_t IndexedReuseTokens(const WorkerHello& hello) {
  const KvPoolAnnounce* pool = IndexedPool(hello);
  return pool == nullptr ? 0 : pool->reuse_tokens;
}

std::string EncodeBye(const WorkerBye& b) {
  capnp::MallocMessageBuilder message;
  auto out = message.initRoot<schema::ToRouter>().initBye();
  out.setWorkerId(wire::AsText(b.name));
  out.setEpoch(b.epoch);
  return wire::Encode(message);
}

Result<ToRouterMessage> DecodeToRouter(const void* data, size_t size) {
  auto decoded = wire::Decode<schema::ToRouter>(data, size);
  if (!decoded.ok()) return decoded.status();
  try {
    auto root = (*decoded)->Root<schema::ToRouter>();
    if (root.isHello()) {
      KVF_ASSIGN_OR_RETURN(WorkerHello hello, ReadHello(root.getHello()));
      return ToRouterMessage(std::move(hello));
    }
    if (root.isBye()) {
      auto b = root.getBye();
      return ToRouterMessage(WorkerBye{wire::FromText(b.getWorkerId()), b.getEpoch()});
    }
    return DataLoss("ToRouter of an unknown kind");
  } catch (const kj::Exception& e) {
    return DataLoss(std::string("malformed message: ") + e.getDescription().cStr());
  }
}

}  // namespace kvfleet
