#include "worker/backend/cuda/cuda_tuning.h"

#include <cstdlib>

#include "kernels/gemv.h"

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

}  // namespace

Result<CudaTuning> ParseCudaTuning(const std::map<std::string, std::string>& extra) {
  CudaTuning t;
  KVF_RETURN_IF_ERROR(ParseSwitch(extra, "cuda_graphs", &t.use_graphs));
  KVF_RETURN_IF_ERROR(ParseSwitch(extra, "moe_gemv", &t.moe_gemv));
  KVF_RETURN_IF_ERROR(ParseSwitch(extra, "moe_blas", &t.moe_blas));
  if (auto it = extra.find("gemv_max_rows"); it != extra.end()) {
    char* end = nullptr;
    const long v = std::strtol(it->second.c_str(), &end, 10);
    if (end == it->second.c_str() || *end != '\0' || v < 0 || v > kernels::kGemvMaxRows) {
      return InvalidArgument("cuda backend: gemv_max_rows must be an integer in [0, " +
                             std::to_string(kernels::kGemvMaxRows) + "], got '" + it->second + "'");
    }
    t.gemv_max_rows = static_cast<int32_t>(v);
  }
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
