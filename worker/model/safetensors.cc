#include "worker/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

namespace kvfleet::model {
namespace {

// The format caps the header at 100 MB; anything larger is a corrupt length.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

Result<DType> ParseDType(const std::string& s, const std::string& tensor) {
  if (s == "F32") return DType::kF32;
  if (s == "F16") return DType::kF16;
  if (s == "BF16") return DType::kBF16;
  return Unimplemented("tensor " + tensor + ": dtype " + s + " is not supported (F32, F16, BF16)");
}

}  // namespace

std::string_view DTypeName(DType d) {
  switch (d) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
  }
  return "?";
}

size_t DTypeSize(DType d) { return d == DType::kF32 ? 4 : 2; }

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

uint16_t F32ToBF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float BF16ToF32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float F16ToF32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t u;
  if (exp == 0x1F) {
    u = sign | 0x7F800000u | (mant << 13);  // inf / NaN
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    u = sign;
  } else {  // subnormal: normalise
    int shift = 0;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      ++shift;
    }
    mant &= 0x3FFu;
    u = sign | (static_cast<uint32_t>(113 - shift) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void ConvertToF32(DType dtype, const std::byte* src, size_t n, float* dst) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kBF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = BF16ToF32(h);
      }
      return;
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        dst[i] = F16ToF32(h);
      }
      return;
  }
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NotFound(path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return Internal(path + ": fstat: " + std::strerror(e));
  }
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (f->size_ < 8) {
    ::close(fd);
    return DataLoss(path + ": truncated: " + std::to_string(f->size_) + " bytes, no header");
  }
  void* map = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  ::close(fd);
  if (map == MAP_FAILED) return Internal(path + ": mmap: " + std::strerror(e));
  f->map_ = map;
  const auto* base = static_cast<const std::byte*>(map);

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | std::to_integer<uint64_t>(base[i]);
  if (header_len > kMaxHeaderBytes || 8 + header_len > f->size_) {
    return DataLoss(path + ": truncated or corrupt: header of " + std::to_string(header_len) +
                    " bytes in a file of " + std::to_string(f->size_));
  }
  std::string_view text(reinterpret_cast<const char*>(base + 8), header_len);
  nlohmann::json h = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (h.is_discarded() || !h.is_object()) return DataLoss(path + ": header is not a JSON object");
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = f->size_ - data_start;

  // Report the first missing tensor in file order, the one a truncation cut.
  std::string first_missing;
  uint64_t first_missing_begin = UINT64_MAX;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") continue;
    const nlohmann::json& t = it.value();
    if (!t.is_object() || !t.contains("dtype") || !t["dtype"].is_string() || !t.contains("shape") ||
        !t["shape"].is_array() || !t.contains("data_offsets") || !t["data_offsets"].is_array() ||
        t["data_offsets"].size() != 2) {
      return DataLoss(path + ": tensor " + name + ": malformed header entry");
    }
    KVF_ASSIGN_OR_RETURN(DType dtype, ParseDType(t["dtype"].get<std::string>(), name));
    TensorView v;
    v.dtype = dtype;
    uint64_t numel = 1;
    for (const auto& d : t["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) return DataLoss(path + ": tensor " + name + ": bad shape");
      v.shape.push_back(d.get<int64_t>());
      numel *= static_cast<uint64_t>(d.get<int64_t>());
    }
    const auto& off = t["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return DataLoss(path + ": tensor " + name + ": bad data_offsets");
    }
    uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (end < begin || end - begin != numel * DTypeSize(dtype)) {
      return DataLoss(path + ": tensor " + name + ": data_offsets [" + std::to_string(begin) + ", " +
                      std::to_string(end) + ") do not hold " + std::to_string(numel) + " " +
                      std::string(DTypeName(dtype)) + " elements");
    }
    if (end > data_size) {
      if (begin < first_missing_begin) {
        first_missing_begin = begin;
        first_missing = name;
      }
      continue;
    }
    v.bytes = std::span<const std::byte>(base + data_start + begin, end - begin);
    f->tensors_.emplace(name, std::move(v));
  }
  if (!first_missing.empty()) {
    return DataLoss(path + ": truncated: tensor " + first_missing + " needs bytes past the end of the file (" +
                    std::to_string(f->size_) + " bytes)");
  }
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

const TensorView* SafetensorsFile::Find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

}  // namespace kvfleet::model
