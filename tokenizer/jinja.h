// A Jinja template engine for chat templates: the subset of Jinja2 that Hugging Face
// chat templates use, rendering exactly as @huggingface/jinja (the reference of
// transformers.js) does.
//
// Supported: {{ }}, {% %}, {# #}, whitespace control (-), trim_blocks / lstrip_blocks as
// transformers sets them; if / elif / else, for (with else, loop.*, unpacking, filters
// over the iterable), set (also namespace attributes and blocks), macro / call, filter
// blocks, break / continue; literals (strings, numbers, lists, dicts, tuples); operators
// (+ - * / // % ~, comparisons, and / or / not, in / not in, is [not] tests, ternary
// if-else, slicing); the filters and methods that chat templates use (see jinja_filters.cc).
// A construct outside the subset fails to parse (or to render) with an error naming it.
//
// Thread safety: a parsed Template is immutable; Render is thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace kvfleet::tok::jinja {

struct Node;

class Template {
 public:
  static Result<std::shared_ptr<const Template>> Parse(std::string_view source);
  ~Template();
  // `context` is a JSON object: its members become the template's variables, objects with
  // their keys in the order given. raise_exception(msg) and strftime_now(fmt) are always
  // defined.
  Result<std::string> Render(const nlohmann::ordered_json& context) const;

 private:
  Template();
  std::unique_ptr<Node> root_;
};

}  // namespace kvfleet::tok::jinja
