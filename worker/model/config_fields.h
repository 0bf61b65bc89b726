// Typed reads of config.json fields, shared by the parsers of model_config.cc and
// llama4_config.cc: each error names the field ("config.json: FIELD: what").
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace kvfleet::model::config_fields {

inline Status FieldError(std::string_view field, std::string_view what) {
  return InvalidArgument("config.json: " + std::string(field) + ": " + std::string(what));
}

// An integer field; `fallback` when absent or null, an error when required and absent.
inline Result<int64_t> GetInt(const nlohmann::json& j, const char* field, std::optional<int64_t> fallback) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) {
    if (fallback) return *fallback;
    return FieldError(field, "missing");
  }
  if (!it->is_number_integer()) return FieldError(field, "not an integer: " + it->dump());
  return it->get<int64_t>();
}

inline Result<double> GetNumber(const nlohmann::json& j, const char* field, double fallback) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number()) return FieldError(field, "not a number: " + it->dump());
  return it->get<double>();
}

inline Result<bool> GetBool(const nlohmann::json& j, const char* field, bool fallback) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return FieldError(field, "not a boolean: " + it->dump());
  return it->get<bool>();
}

// A list of layer indices (moe_layers, mlp_only_layers) as a per-layer mask; errors name the
// field and the entry ("FIELD[i]: not a layer index: ...").
inline Result<std::vector<bool>> LayerSet(const nlohmann::json& list, const char* field, int64_t layers) {
  if (!list.is_array()) return FieldError(field, "not a list: " + list.dump());
  std::vector<bool> mask(static_cast<size_t>(layers), false);
  for (size_t i = 0; i < list.size(); ++i) {
    const nlohmann::json& l = list[i];
    if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() >= layers) {
      return FieldError(std::string(field) + "[" + std::to_string(i) + "]", "not a layer index: " + l.dump());
    }
    mask[l.get<size_t>()] = true;
  }
  return mask;
}

}  // namespace kvfleet::model::config_fields
