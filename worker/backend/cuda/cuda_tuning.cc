#include "worker/backend/cuda/cuda_tuning.h"

#include <cstdlib>

#include "kernels/gemv.h"
#include "kernels/lora.h"

namespace kvfleet::backend::cuda {

namespace {

// A 0 | 1 switch: absent keeps `*on` as it is.
Status ParseSwitch(const std::map<std::string, std::string>& extra, const char* name, bool* on) {
  auto it = extra.find(name);
  if (it == extra.end()) return Status::Ok();
  if (it->second != "0" && it->second != "1") {
    return InvalidArgument(std::string("cuda backend: ") + name + " must be 0 or 1, got '" + it->second + "'");
  }
  *on = it->second == "1";
  return Status::Ok();
}

// An integer switch in [lo, hi]: absent keeps `*value` as it is.
Status ParseIntIn(const std::map<std::string, std::string>& extra, const char* name, long lo, long hi,
                  int32_t* value) {
  auto it = extra.find(name);
  if (it == extra.end()) return Status::Ok();
  char* end = nullptr;
  const long v = std::strtol(it->second.c_str(), &end, 10);
  if (end == it->second.c_str() || *end != '\0' || v < lo || v > hi) {
    return InvalidArgument(std::string("cuda backend: ") + name + " must be an integer in [" + std::to_string(lo) +
                           ", " + std::to_string(hi) + "], got '" + it->second + "'");
  }
  *value = static_cast<int32_t>(v);
  return Status::Ok();
}

}  // namespace

Result<CudaTuning> ParseCudaTuning(const std::map<std::string, std::string>& extra) {
  CudaTuning t;
  KVF_RETURN_IF_ERROR(ParseSwitch(extra, "cuda_graphs", &t.use_graphs));
  KVF_RETURN_IF_ERROR(ParseSwitch(extra, "moe_gemv", &t.moe_gemv));
  KVF_RETURN_IF_ERROR(ParseSwitch(extra, "moe_blas", &t.moe_blas));
  KVF_RETURN_IF_ERROR(ParseIntIn(extra, "gemv_max_rows", 0, kernels::kGemvMaxRows, &t.gemv_max_rows));
  KVF_RETURN_IF_ERROR(ParseIntIn(extra, "lora_tile_rows", 1, kernels::kLoraMaxTileRows, &t.lora_tile_rows));
  if (auto it = extra.find("gemv_fusion"); it != extra.end()) {
    if (it->second.size() != 1 || it->second[0] < '0' || it->second[0] > '4') {
      return InvalidArgument("cuda backend: gemv_fusion must be 0..4, got '" + it->second + "'");
    }
    t.gemv_fusion = it->second[0] - '0';
  }
  if (extra.count("pdl") > 0) {
    bool on = true;
    KVF_RETURN_IF_ERROR(ParseSwitch(extra, "pdl", &on));
    t.pdl = on;
  }
  return t;
}

}  // namespace kvfleet::backend::cuda
