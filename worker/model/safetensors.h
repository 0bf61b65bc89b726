// Safetensors files (https://huggingface.co/docs/safetensors): an 8-byte little-endian
// header length, a JSON header {name: {dtype, shape, data_offsets}}, then the tensor bytes.
//
// SafetensorsFile memory-maps one file read-only and checks its header completely at
// Open(): every tensor's byte range lies inside the file and matches dtype × shape. A
// truncated file fails there, naming the first tensor whose bytes are missing.
//
// Thread safety: immutable after Open(); views may be read from any thread while the
// file object lives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kvfleet::model {

enum class DType : uint8_t { kF32, kF16, kBF16 };
std::string_view DTypeName(DType d);  // the safetensors spelling: "F32", "F16", "BF16"
size_t DTypeSize(DType d);

// One tensor inside a mapped file.
struct TensorView {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::span<const std::byte> bytes;  // points into the mapping
  int64_t numel() const;
};

// Converts `src` (n elements of `dtype`) to fp32. bf16 and fp16 are exact in fp32.
void ConvertToF32(DType dtype, const std::byte* src, size_t n, float* dst);
// Round to nearest even, NaN kept NaN.
uint16_t F32ToBF16(float f);
float BF16ToF32(uint16_t h);
float F16ToF32(uint16_t h);

class SafetensorsFile {
 public:
  // Maps `path` and validates its header. DataLoss for a truncated or inconsistent
  // file; Unimplemented for a dtype other than F32/F16/BF16 (naming the tensor).
  static Result<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return size_; }
  const std::map<std::string, TensorView, std::less<>>& tensors() const { return tensors_; }
  // nullptr when absent.
  const TensorView* Find(std::string_view name) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  uint64_t size_ = 0;
  std::map<std::string, TensorView, std::less<>> tensors_;
};

}  // namespace kvfleet::model
