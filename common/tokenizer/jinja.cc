#include "common/tokenizer/jinja.h"
namespace kvfleet::tok::jinja {
struct Node {};
Template::Template() = default;
Template::~Template() = default;
Result<std::shared_ptr<const Template>> Template::Parse(std::string_view) { return Unimplemented("jinja: todo"); }
Result<std::string> Template::Render(const nlohmann::json&) const { return Unimplemented("todo"); }
}
