#include "worker/model/lora_adapter.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "common/block_hash.h"
#include "common/tokenizer_files.h"
#include "worker/model/random_model.h"
#include "worker/model/safetensors.h"

namespace kvfleet::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kConfigFile = "adapter_config.json";
constexpr const char* kWeightsFile = "adapter_model.safetensors";

constexpr LoraTarget kAllTargets[kNumLoraTargets] = {LoraTarget::kQ,    LoraTarget::kK,  LoraTarget::kV,
                                                      LoraTarget::kO,    LoraTarget::kGate, LoraTarget::kUp,
                                                      LoraTarget::kDown};

bool IsAttention(LoraTarget t) { return t == LoraTarget::kQ || t == LoraTarget::kK || t == LoraTarget::kV || t == LoraTarget::kO; }

// The tensor name PEFT's save_pretrained writes for one matrix ("A" or "B").
std::string TensorName(int64_t layer, LoraTarget t, const char* ab) {
  return "base_model.model.model.layers." + std::to_string(layer) + (IsAttention(t) ? ".self_attn." : ".mlp.") +
         LoraTargetName(t) + ".lora_" + ab + ".weight";
}

// The part of a path after its last '/', ignoring trailing slashes.
std::string LastComponent(std::string p) {
  while (!p.empty() && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

// The fields of adapter_config.json a loader honours; every other field PEFT writes must
// hold its no-op value.
struct AdapterConfig {
  int32_t rank = 0;
  double alpha = 0;
  bool rslora = false;
  std::array<bool, kNumLoraTargets> targets{};
  std::string base_model;
};

Result<AdapterConfig> ParseAdapterConfig(const std::string& path, std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& field, const std::string& why) {
    return InvalidArgument(path + ": " + field + ": " + why);
  };
  if (j.is_discarded() || !j.is_object()) return InvalidArgument(path + ": not a JSON object");
  AdapterConfig c;
  if (j.contains("peft_type") && j["peft_type"] != "LORA") return bad("peft_type", "only LORA adapters are served");
  if (!j.contains("r") || !j["r"].is_number_integer()) return bad("r", "missing or not an integer");
  const int64_t r = j["r"].get<int64_t>();
  if (r < 1 || r > kMaxLoraRank) {
    return bad("r", "rank " + std::to_string(r) + " is outside 1.." + std::to_string(kMaxLoraRank));
  }
  c.rank = static_cast<int32_t>(r);
  if (!j.contains("lora_alpha") || !j["lora_alpha"].is_number()) return bad("lora_alpha", "missing or not a number");
  c.alpha = j["lora_alpha"].get<double>();
  if (!std::isfinite(c.alpha)) return bad("lora_alpha", "not finite");
  auto flag = [&](const char* key, bool* out) -> Status {
    if (!j.contains(key) || j[key].is_null()) return Status::Ok();
    if (!j[key].is_boolean()) return bad(key, "not a boolean");
    *out = j[key].get<bool>();
    return Status::Ok();
  };
  KVF_RETURN_IF_ERROR(flag("use_rslora", &c.rslora));
  bool dora = false, fan_in_fan_out = false;
  KVF_RETURN_IF_ERROR(flag("use_dora", &dora));
  if (dora) return bad("use_dora", "DoRA adapters are not supported");
  KVF_RETURN_IF_ERROR(flag("fan_in_fan_out", &fan_in_fan_out));
  if (fan_in_fan_out) return bad("fan_in_fan_out", "only Linear layers (false) are supported");
  if (j.contains("bias") && j["bias"] != "none") return bad("bias", "trained biases are not supported (must be \"none\")");
  for (const char* key : {"rank_pattern", "alpha_pattern"}) {
    if (j.contains(key) && !j[key].is_null() && !(j[key].is_object() && j[key].empty())) {
      return bad(key, "per-module ranks and alphas are not supported (must be empty)");
    }
  }
  for (const char* key : {"layers_to_transform", "layers_pattern", "modules_to_save"}) {
    if (j.contains(key) && !j[key].is_null() && !(j[key].is_array() && j[key].empty())) {
      return bad(key, "must be null: adapters apply to every layer and save no extra modules");
    }
  }
  if (!j.contains("target_modules") || j["target_modules"].is_null()) return bad("target_modules", "missing");
  auto add_target = [&](const std::string& name) -> Status {
    const size_t dot = name.rfind('.');
    const std::string m = dot == std::string::npos ? name : name.substr(dot + 1);  // "self_attn.q_proj" → "q_proj"
    for (LoraTarget t : kAllTargets) {
      if (m == LoraTargetName(t)) {
        c.targets[static_cast<int>(t)] = true;
        return Status::Ok();
      }
    }
    return bad("target_modules", "'" + name + "' is not one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj");
  };
  const json& tm = j["target_modules"];
  if (tm.is_string()) {
    const std::string s = tm.get<std::string>();
    if (s == "all-linear") {
      c.targets.fill(true);
    } else {
      KVF_RETURN_IF_ERROR(add_target(s));
    }
  } else if (tm.is_array() && !tm.empty()) {
    for (const json& m : tm) {
      if (!m.is_string()) return bad("target_modules", "entries must be strings");
      KVF_RETURN_IF_ERROR(add_target(m.get<std::string>()));
    }
  } else {
    return bad("target_modules", "must be a non-empty list of module names or \"all-linear\"");
  }
  if (j.contains("base_model_name_or_path") && j["base_model_name_or_path"].is_string()) {
    c.base_model = j["base_model_name_or_path"].get<std::string>();
  }
  return c;
}

// Where one matrix of one layer lives in the file: PEFT's name, or its adapter-named
// variant (`lora_A.default.weight`, as some PEFT versions save).
// *found: the name it was found under.
const TensorView* FindMatrix(const SafetensorsFile& f, int64_t layer, LoraTarget t, const char* ab, std::string* found) {
  *found = TensorName(layer, t, ab);
  if (const TensorView* v = f.Find(*found)) return v;
  *found = found->substr(0, found->size() - std::string_view(".weight").size()) + ".default.weight";
  return f.Find(*found);
}

}  // namespace

const char* LoraTargetName(LoraTarget target) {
  switch (target) {
    case LoraTarget::kQ: return "q_proj";
    case LoraTarget::kK: return "k_proj";
    case LoraTarget::kV: return "v_proj";
    case LoraTarget::kO: return "o_proj";
    case LoraTarget::kGate: return "gate_proj";
    case LoraTarget::kUp: return "up_proj";
    case LoraTarget::kDown: return "down_proj";
  }
  return "?";
}

LoraDims LoraTargetDims(const ModelConfig& c, LoraTarget target) {
  const auto h = static_cast<int32_t>(c.hidden_size), q = static_cast<int32_t>(c.q_size()),
             kv = static_cast<int32_t>(c.kv_size()), inter = static_cast<int32_t>(c.intermediate_size);
  switch (target) {
    case LoraTarget::kQ: return {h, q};
    case LoraTarget::kK:
    case LoraTarget::kV: return {h, kv};
    case LoraTarget::kO: return {q, h};
    case LoraTarget::kGate:
    case LoraTarget::kUp: return {h, inter};
    case LoraTarget::kDown: return {inter, h};
  }
  return {};
}

bool LoraAdapter::Targets(LoraTarget t) const {
  for (const auto& layer : layers) {
    if (!layer[static_cast<int>(t)].empty()) return true;
  }
  return false;
}

uint64_t LoraAdapter::Fp32Bytes() const {
  uint64_t n = 0;
  for (const auto& layer : layers) {
    for (const LoraMatrices& m : layer) n += (m.a.size() + m.b.size()) * sizeof(float);
  }
  return n;
}

Result<LoraAdapter> LoadLoraAdapter(const std::string& name, const std::string& dir, const ModelConfig& config,
                                    const std::string& served_model, const std::string& model_dir) {
  const std::string config_path = dir + "/" + kConfigFile, weights_path = dir + "/" + kWeightsFile;
  auto text = ReadModelFile(config_path);
  if (!text.ok()) return NotFound("LoRA adapter '" + name + "': " + text.status().message());
  KVF_ASSIGN_OR_RETURN(AdapterConfig ac, ParseAdapterConfig(config_path, *text));
  if (!ac.base_model.empty()) {
    const std::string base = LastComponent(ac.base_model);
    if (base != LastComponent(served_model) && base != LastComponent(model_dir)) {
      return InvalidArgument(config_path + ": base_model_name_or_path: '" + ac.base_model +
                             "' is not this worker's model ('" + served_model + "', " + model_dir + ")");
    }
  }
  if (!fs::exists(weights_path)) {
    return NotFound("LoRA adapter '" + name + "': " + weights_path + ": missing (adapter_model.bin is not read)");
  }
  KVF_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(weights_path));

  LoraAdapter a;
  a.name = name;
  a.lora_id = LoraId(name);
  a.base_model = ac.base_model;
  a.path = dir;
  a.rank = ac.rank;
  a.scaling = static_cast<float>(ac.rslora ? ac.alpha / std::sqrt(static_cast<double>(ac.rank)) : ac.alpha / ac.rank);
  a.layers.resize(static_cast<size_t>(config.num_layers));
  std::set<std::string, std::less<>> consumed;  // the tensors read
  for (int64_t l = 0; l < config.num_layers; ++l) {
    for (LoraTarget t : kAllTargets) {
      if (!ac.targets[static_cast<int>(t)]) continue;
      if (!IsAttention(t) && config.sparse_layer(l)) continue;  // an MoE layer: no dense gate/up/down
      const LoraDims d = LoraTargetDims(config, t);
      std::string name_a, name_b;
      const TensorView* va = FindMatrix(*file, l, t, "A", &name_a);
      const TensorView* vb = FindMatrix(*file, l, t, "B", &name_b);
      if (va == nullptr || vb == nullptr) {
        return InvalidArgument(weights_path + ": " + TensorName(l, t, va == nullptr ? "A" : "B") +
                               ": missing (target_modules names " + LoraTargetName(t) + ")");
      }
      auto check = [&](const TensorView* v, const char* ab, int64_t rows, int64_t cols) -> Status {
        if (v->shape == std::vector<int64_t>{rows, cols}) return Status::Ok();
        std::string got;
        for (int64_t s : v->shape) got += (got.empty() ? "" : ", ") + std::to_string(s);
        return InvalidArgument(weights_path + ": " + TensorName(l, t, ab) + ": shape [" + got + "], expected [" +
                               std::to_string(rows) + ", " + std::to_string(cols) + "] (rank " +
                               std::to_string(ac.rank) + ", the model's " + LoraTargetName(t) + " is " +
                               std::to_string(d.in) + " → " + std::to_string(d.out) + ")");
      };
      KVF_RETURN_IF_ERROR(check(va, "A", ac.rank, d.in));
      KVF_RETURN_IF_ERROR(check(vb, "B", d.out, ac.rank));
      LoraMatrices& m = a.layers[l][static_cast<int>(t)];
      m.a.resize(static_cast<size_t>(va->numel()));
      m.b.resize(static_cast<size_t>(vb->numel()));
      ConvertToF32(va->dtype, va->bytes.data(), m.a.size(), m.a.data());
      ConvertToF32(vb->dtype, vb->bytes.data(), m.b.size(), m.b.data());
      consumed.insert(name_a);
      consumed.insert(name_b);
    }
  }
  // A tensor the config does not account for (another target, a layer past the model's, an
  // embedding or lm_head adapter) would be silently ignored: refuse it.
  for (const auto& [tensor, view] : file->tensors()) {
    if (!consumed.contains(tensor) && tensor.find(".experts.") != std::string::npos) {
      return InvalidArgument(weights_path + ": " + tensor + ": adapters of MoE experts are not supported (an MoE " +
                             "layer's adapter may target q_proj, k_proj, v_proj and o_proj)");
    }
    if (!consumed.contains(tensor)) {
      return InvalidArgument(weights_path + ": " + tensor + ": not the lora_A or lora_B matrix of a target_modules " +
                             "projection of the model's " + std::to_string(config.num_layers) + " layers");
    }
  }
  return a;
}

Status WriteRandomLoraAdapter(const std::string& dir, const ModelConfig& config, const RandomLoraOptions& o) {
  if (o.rank < 1 || o.rank > kMaxLoraRank) {
    return InvalidArgument("LoRA rank " + std::to_string(o.rank) + " is outside 1.." + std::to_string(kMaxLoraRank));
  }
  if (o.targets.empty()) return InvalidArgument("a LoRA adapter needs at least one target");
  if (o.dtype != DType::kF32 && o.dtype != DType::kBF16) return InvalidArgument("LoRA adapters are written in fp32 or bf16");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Unavailable(dir + ": " + ec.message());

  json targets = json::array();
  for (LoraTarget t : o.targets) targets.push_back(LoraTargetName(t));
  const json cfg{{"peft_type", "LORA"},
                 {"task_type", "CAUSAL_LM"},
                 {"base_model_name_or_path", o.base_model},
                 {"r", o.rank},
                 {"lora_alpha", o.alpha},
                 {"lora_dropout", 0.0},
                 {"target_modules", targets},
                 {"bias", "none"},
                 {"use_rslora", false},
                 {"use_dora", false},
                 {"fan_in_fan_out", false},
                 {"rank_pattern", json::object()},
                 {"alpha_pattern", json::object()},
                 {"layers_to_transform", nullptr},
                 {"layers_pattern", nullptr},
                 {"modules_to_save", nullptr},
                 {"inference_mode", true}};

  // Tensors in name order (safetensors' own order); B's range keeps scaling·B·A·x at about
  // half the base projection's output, so an adapter changes greedy tokens without swamping them.
  struct Spec {
    std::string name;
    int64_t rows, cols;
    float half_range;
  };
  std::vector<Spec> specs;
  const float scaling = o.alpha / static_cast<float>(o.rank);
  for (int64_t l = 0; l < config.num_layers; ++l) {
    for (LoraTarget t : o.targets) {
      if (!IsAttention(t) && config.sparse_layer(l)) continue;  // as LoadLoraAdapter reads it
      const LoraDims d = LoraTargetDims(config, t);
      specs.push_back({TensorName(l, t, "A"), o.rank, d.in, std::sqrt(3.0f / static_cast<float>(d.in))});
      specs.push_back({TensorName(l, t, "B"), d.out, o.rank,
                       0.5f * std::sqrt(3.0f / static_cast<float>(o.rank)) / std::max(scaling, 1e-6f)});
    }
  }
  std::sort(specs.begin(), specs.end(), [](const Spec& x, const Spec& y) { return x.name < y.name; });
  json header = json::object();
  header["__metadata__"] = json{{"format", "pt"}};
  uint64_t offset = 0;
  for (const Spec& s : specs) {
    const uint64_t bytes = static_cast<uint64_t>(s.rows * s.cols) * DTypeSize(o.dtype);
    header[s.name] = json{{"dtype", DTypeName(o.dtype)}, {"shape", {s.rows, s.cols}}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string head = header.dump();
  while (head.size() % 8 != 0) head.push_back(' ');

  const std::string path = dir + "/" + kWeightsFile, tmp = path + ".partial";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(head.size()) >> (8 * i));
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(head.data(), static_cast<std::streamsize>(head.size()));
    std::vector<float> f32;
    std::vector<uint16_t> b16;
    for (const Spec& s : specs) {
      const uint64_t key = RandomTensorKey(o.seed, s.name);
      const float step = s.half_range / 8388608.0f;
      f32.resize(static_cast<size_t>(s.rows * s.cols));
      for (size_t i = 0; i < f32.size(); ++i) f32[i] = RandomWeight(key, i, step, 0.0f);
      if (o.dtype == DType::kBF16) {
        b16.resize(f32.size());
        for (size_t i = 0; i < f32.size(); ++i) b16[i] = F32ToBF16(f32[i]);
        out.write(reinterpret_cast<const char*>(b16.data()), static_cast<std::streamsize>(b16.size() * 2));
      } else {
        out.write(reinterpret_cast<const char*>(f32.data()), static_cast<std::streamsize>(f32.size() * 4));
      }
    }
    if (!out) return Unavailable(tmp + ": write failed: " + std::strerror(errno));
  }
  fs::rename(tmp, path, ec);
  if (ec) return Unavailable(path + ": " + ec.message());
  std::ofstream out(dir + "/" + kConfigFile, std::ios::binary | std::ios::trunc);
  out << cfg.dump(2) << "\n";
  if (!out) return Unavailable(dir + "/" + kConfigFile + ": write failed");
  return Status::Ok();
}

}  // namespace kvfleet::model
