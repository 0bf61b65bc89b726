// The Jinja interpreter's filters (`x | name`, `x | name(...)`), tests (`x is name`) and
// the methods of strings and mappings (`s.split()`, `d.items()`), the ones chat templates
// use, as @huggingface/jinja defines them, quirks included.
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "tokenizer/jinja_internal.h"
#include "tokenizer/jinja_interpreter.h"
#include "tokenizer/jinja_value.h"
#include "tokenizer/unicode.h"

namespace kvfleet::tok::jinja {

ValuePtr Interpreter::ApplyFilter(const ValuePtr& operand, const Node& filter, Env& env) {
  if (filter.kind == NodeKind::kIdentifier) return SimpleFilter(operand, filter.text, env);
  if (filter.kind != NodeKind::kCall || filter.a->kind != NodeKind::kIdentifier) throw RenderError("unknown filter");
  const std::string& name = filter.a->text;
  std::shared_ptr<Object> kwargs;
  std::vector<ValuePtr> args = Arguments(filter.args, env, false, &kwargs);
  auto arg = [&](size_t i, const char* key) -> ValuePtr {
    if (i < args.size()) return args[i];
    return kwargs->Get(key);
  };
  const Value& v = *operand;
  if (name == "tojson") {
    JsonOptions o;
    if (ValuePtr x = kwargs->Get("indent"); x && x->kind != Kind::kNull) {
      if (x->kind != Kind::kInt) throw RenderError("if set, indent must be a number");
      o.indent = x->integer;
    }
    if (ValuePtr x = kwargs->Get("ensure_ascii")) o.ensure_ascii = Truthy(*x);
    if (ValuePtr x = kwargs->Get("sort_keys")) o.sort_keys = Truthy(*x);
    if (ValuePtr x = kwargs->Get("separators"); x && IsArray(*x) && x->items.size() == 2) {
      o.separators = std::make_pair(x->items[0]->str, x->items[1]->str);
    }
    return Str(ToJson(v, o, 0, true));
  }
  if (name == "join") {
    std::vector<std::string> parts;
    if (v.kind == Kind::kString) parts = CodePoints(v.str);
    else if (IsArray(v)) for (const auto& x : v.items) parts.push_back(x->kind == Kind::kString ? x->str : RawString(*x));
    else throw RenderError(std::string("cannot apply filter \"join\" to type: ") + TypeName(v));
    ValuePtr sep = arg(0, "separator");
    std::string sep_s = sep ? sep->str : "";
    std::string out;
    for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep_s : "") + parts[i];
    return Str(out);
  }
  if (name == "default") {
    ValuePtr dflt = args.size() > 0 ? args[0] : Str("");
    ValuePtr boolean = arg(1, "boolean");
    bool b = boolean && Truthy(*boolean);
    if (v.kind == Kind::kUndefined || (b && !Truthy(v))) return dflt;
    return operand;
  }
  if (name == "indent" && v.kind == Kind::kString) {
    ValuePtr width = arg(0, "width");
    ValuePtr first = arg(1, "first");
    ValuePtr blank = arg(2, "blank");
    std::string pad(static_cast<size_t>(width && width->kind == Kind::kInt ? width->integer : 4), ' ');
    auto lines = SplitString(v.str, "\n");
    std::string out;
    for (size_t i = 0; i < lines.size(); ++i) {
      bool keep = (!(first && Truthy(*first)) && i == 0) || (!(blank && Truthy(*blank)) && lines[i].empty());
      out += (i ? "\n" : "") + (keep ? lines[i] : pad + lines[i]);
    }
    return Str(out);
  }
  if (name == "replace" && v.kind == Kind::kString) {
    ValuePtr fn = StringMethod(operand, "replace");
    std::vector<ValuePtr> all = args;
    all.push_back(MakeObject(kwargs, Kind::kKwargs));
    return fn->fn(all, env);
  }
  if (name == "map" && IsArray(v)) {
    ValuePtr attr = kwargs->Get("attribute");
    if (!attr || attr->kind != Kind::kString) throw RenderError("`map` expressions without `attribute` set are not supported");
    std::vector<ValuePtr> out;
    for (const auto& x : v.items) {
      if (!IsObject(*x) && x->kind != Kind::kNamespace) throw RenderError("items in map must be an object");
      ValuePtr got = x->object->Get(attr->str);
      ValuePtr dflt = kwargs->Get("default");
      out.push_back(got ? got : (dflt ? dflt : Undefined()));
    }
    return Array(std::move(out));
  }
  if ((name == "selectattr" || name == "rejectattr") && IsArray(v)) {
    bool select = name == "selectattr";
    if (args.empty() || args[0]->kind != Kind::kString) throw RenderError("arguments of `" + name + "` must be strings");
    std::vector<ValuePtr> out;
    for (const auto& x : v.items) {
      if (!IsObject(*x) && x->kind != Kind::kNamespace) throw RenderError("`" + name + "` can only be applied to array of objects");
      ValuePtr a = x->object->Get(args[0]->str);
      bool result = false;
      if (a && Truthy(*a)) {
        result = args.size() > 1 ? RunTestWith(args[1]->str, *a, args.size() > 2 ? args[2].get() : nullptr) : Truthy(*a);
      }
      if (result == select) out.push_back(x);
    }
    return Array(std::move(out));
  }
  if (IsObject(v)) {
    if (ValuePtr m = ObjectMethod(operand, name)) {
      std::vector<ValuePtr> all = args;
      if (!kwargs->entries.empty()) all.push_back(MakeObject(kwargs, Kind::kKwargs));
      return m->fn(all, env);
    }
  }
  throw RenderError("unsupported filter: " + name + "(...) on " + TypeName(v));
}

ValuePtr Interpreter::SimpleFilter(const ValuePtr& operand, const std::string& name, Env& env) {
  const Value& v = *operand;
  if (name == "safe") return operand;
  if (name == "tojson") return Str(ToJson(v, {}, 0, true));
  if (IsArray(v)) {
    if (name == "list") return operand;
    if (name == "first") return v.items.empty() ? Undefined() : v.items.front();
    if (name == "last") return v.items.empty() ? Undefined() : v.items.back();
    if (name == "length") return Int(static_cast<int64_t>(v.items.size()));
    if (name == "reverse") return Array(std::vector<ValuePtr>(v.items.rbegin(), v.items.rend()));
    if (name == "join") {
      std::string out;
      for (const auto& x : v.items) out += x->kind == Kind::kString ? x->str : RawString(*x);
      return Str(out);
    }
    if (name == "string") return Str(ToJson(v, {}, 0, false));
    throw RenderError("unsupported filter for a list: " + name);
  }
  if (v.kind == Kind::kString) {
    if (name == "length") return Int(static_cast<int64_t>(Utf16Length(v.str)));
    if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
      std::vector<ValuePtr> none;
      return StringMethod(operand, name)->fn(none, env);
    }
    if (name == "trim") return Str(std::string(TrimEndJs(TrimStartJs(v.str))));
    if (name == "indent") {
      auto lines = SplitString(v.str, "\n");
      std::string out;
      for (size_t i = 0; i < lines.size(); ++i) out += (i ? "\n" : "") + ((i == 0 || lines[i].empty()) ? lines[i] : "    " + lines[i]);
      return Str(out);
    }
    if (name == "join" || name == "string") return operand;
    if (name == "int") {
      char* end = nullptr;
      long long x = std::strtoll(std::string(TrimStartJs(v.str)).c_str(), &end, 10);
      return Int(x);
    }
    if (name == "float") return Float(std::strtod(std::string(TrimStartJs(v.str)).c_str(), nullptr));
    throw RenderError("unsupported filter for a string: " + name);
  }
  if (IsNumber(v)) {
    if (name == "abs") return v.kind == Kind::kInt ? Int(v.integer < 0 ? CheckedSub(0, v.integer) : v.integer) : Float(std::fabs(v.number));
    if (name == "int") return Int(IntFromFloat(std::floor(NumberOf(v))));
    if (name == "float") return Float(NumberOf(v));
    if (name == "string") return Str(Display(v));
    throw RenderError("unsupported filter for a number: " + name);
  }
  if (IsObject(v)) {
    if (name == "items") return Items(v);
    if (name == "length") return Int(static_cast<int64_t>(v.object->entries.size()));
    if (ValuePtr m = ObjectMethod(operand, name)) {
      std::vector<ValuePtr> none;
      return m->fn(none, env);
    }
    throw RenderError("unsupported filter for a mapping: " + name);
  }
  if (v.kind == Kind::kBool) {
    if (name == "bool") return Bool(v.boolean);
    if (name == "int") return Int(v.boolean ? 1 : 0);
    if (name == "float") return Float(v.boolean ? 1 : 0);
    if (name == "string") return Str(v.boolean ? "true" : "false");
  }
  throw RenderError("cannot apply filter \"" + name + "\" to type: " + TypeName(v));
}

bool Interpreter::RunTest(const std::string& name, const Value& v) {
  if (name == "boolean") return v.kind == Kind::kBool;
  if (name == "callable") return v.kind == Kind::kFunction;
  if (name == "odd" || name == "even") {
    if (v.kind != Kind::kInt) throw RenderError("cannot " + name + " on " + TypeName(v));
    return (v.integer % 2 != 0) == (name == "odd");
  }
  if (name == "false") return v.kind == Kind::kBool && !v.boolean;
  if (name == "true") return v.kind == Kind::kBool && v.boolean;
  if (name == "none") return v.kind == Kind::kNull;
  if (name == "string") return v.kind == Kind::kString;
  if (name == "number") return IsNumber(v);
  if (name == "integer") return v.kind == Kind::kInt;
  if (name == "iterable") return v.kind == Kind::kArray || v.kind == Kind::kString;  // not tuples, as the reference
  if (name == "mapping") return IsObject(v);
  if (name == "sequence") return IsArray(v) || IsObject(v) || v.kind == Kind::kString;
  if (name == "lower") return v.kind == Kind::kString && v.str == MapCase(v.str, false);
  if (name == "upper") return v.kind == Kind::kString && v.str == MapCase(v.str, true);
  if (name == "defined") return v.kind != Kind::kUndefined;
  if (name == "undefined") return v.kind == Kind::kUndefined;
  throw RenderError("unknown test: " + name);
}

bool Interpreter::RunTestWith(const std::string& name, const Value& v, const Value* other) {
  if ((name == "equalto" || name == "eq") && other) return StrictEquals(v, *other);
  return RunTest(name, v);
}

ValuePtr Interpreter::StringMethod(const ValuePtr& self, const std::string& name) {
  const std::string s = self->str;
  if (name == "length") return Int(static_cast<int64_t>(Utf16Length(s)));
  if (name == "upper") return Fn([s](auto&, Env&) { return Str(MapCase(s, true)); });
  if (name == "lower") return Fn([s](auto&, Env&) { return Str(MapCase(s, false)); });
  // The reference ignores strip/lstrip/rstrip's `chars` argument and trims whitespace.
  if (name == "strip") return Fn([s](auto&, Env&) { return Str(std::string(TrimEndJs(TrimStartJs(s)))); });
  if (name == "lstrip") return Fn([s](auto&, Env&) { return Str(std::string(TrimStartJs(s))); });
  if (name == "rstrip") return Fn([s](auto&, Env&) { return Str(std::string(TrimEndJs(s))); });
  if (name == "title") return Fn([s](auto&, Env&) { return Str(TitleCase(s)); });
  if (name == "capitalize") {
    return Fn([s](auto&, Env&) {
      if (s.empty()) return Str("");
      size_t i = 0;
      std::string first = s.substr(0, Utf8Length(static_cast<unsigned char>(s[0])));
      i = first.size();
      return Str(MapCase(first, true) + s.substr(i));
    });
  }
  if (name == "startswith" || name == "endswith") {
    bool starts = name == "startswith";
    return Fn([s, starts, name](std::vector<ValuePtr>& args, Env&) {
      if (args.empty()) throw RenderError(name + "() requires at least one argument");
      auto test = [&](const std::string& p) {
        return starts ? s.compare(0, p.size(), p) == 0 && s.size() >= p.size()
                      : s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
      };
      if (args[0]->kind == Kind::kString) return Bool(test(args[0]->str));
      if (IsArray(*args[0])) {
        for (const auto& x : args[0]->items) {
          if (x->kind != Kind::kString) throw RenderError(name + "() tuple elements must be strings");
          if (test(x->str)) return Bool(true);
        }
        return Bool(false);
      }
      throw RenderError(name + "() argument must be a string or tuple of strings");
    });
  }
  if (name == "split") {
    return Fn([s](std::vector<ValuePtr>& args, Env&) {
      ValuePtr sep = args.size() > 0 ? args[0] : Null();
      int64_t maxsplit = args.size() > 1 && args[1]->kind == Kind::kInt ? args[1]->integer : -1;
      std::vector<std::string> parts;
      if (sep->kind == Kind::kNull) {
        std::string_view t = TrimStartJs(s);
        size_t i = 0;
        while (i < t.size()) {
          while (i < t.size() && IsJsWhitespace([&] { size_t j = i; return NextCodePoint(t, &j); }())) {
            size_t j = i;
            NextCodePoint(t, &j);
            i = j;
          }
          if (i >= t.size()) break;
          if (maxsplit != -1 && static_cast<int64_t>(parts.size()) >= maxsplit) {
            parts.emplace_back(t.substr(i));
            break;
          }
          size_t b = i;
          while (i < t.size()) {
            size_t j = i;
            if (IsJsWhitespace(NextCodePoint(t, &j))) break;
            i = j;
          }
          parts.emplace_back(t.substr(b, i - b));
        }
      } else if (sep->kind == Kind::kString) {
        if (sep->str.empty()) throw RenderError("empty separator");
        parts = SplitString(s, sep->str);
        if (maxsplit != -1 && static_cast<int64_t>(parts.size()) > maxsplit) {
          std::string rest;
          for (size_t k = static_cast<size_t>(maxsplit); k < parts.size(); ++k) rest += (k > static_cast<size_t>(maxsplit) ? sep->str : "") + parts[k];
          parts.resize(static_cast<size_t>(maxsplit));
          parts.push_back(rest);
        }
      } else {
        throw RenderError("sep argument must be a string or null");
      }
      std::vector<ValuePtr> items;
      for (auto& p : parts) items.push_back(Str(std::move(p)));
      return Array(std::move(items));
    });
  }
  if (name == "replace") {
    return Fn([s](std::vector<ValuePtr>& args, Env&) {
      if (args.size() < 2 || args[0]->kind != Kind::kString || args[1]->kind != Kind::kString) {
        throw RenderError("replace() arguments must be strings");
      }
      int64_t count = -1;
      if (args.size() > 2) {
        ValuePtr c = args[2]->kind == Kind::kKwargs ? args[2]->object->Get("count") : args[2];
        if (c && c->kind == Kind::kInt) count = c->integer;
        else if (c && c->kind != Kind::kNull) throw RenderError("replace() count argument must be a number or null");
      }
      const std::string& from = args[0]->str;
      const std::string& to = args[1]->str;
      if (count == 0) return Str(s);
      std::string out;
      if (from.empty()) {
        auto cps = CodePoints(s);
        int64_t left = count < 0 ? INT64_MAX : count;
        for (size_t i = 0; i <= cps.size(); ++i) {
          if (left-- > 0) out += to;
          if (i < cps.size()) out += cps[i];
        }
        return Str(out);
      }
      size_t last = 0;
      int64_t left = count < 0 ? INT64_MAX : count;
      for (size_t pos = s.find(from); pos != std::string::npos && left > 0; pos = s.find(from, last), --left) {
        out += s.substr(last, pos - last) + to;
        last = pos + from.size();
      }
      return Str(out + s.substr(last));
    });
  }
  return Undefined();
}

ValuePtr Interpreter::ObjectMethod(const ValuePtr& self, const std::string& name) {
  auto obj = self->object;
  if (name == "get") {
    return Fn([obj](std::vector<ValuePtr>& args, Env&) {
      if (args.empty() || args[0]->kind != Kind::kString) throw RenderError("object key must be a string");
      ValuePtr v = obj->Get(args[0]->str);
      return v ? v : (args.size() > 1 ? args[1] : Null());
    });
  }
  if (name == "items") return Fn([self](auto&, Env&) { return Items(*self); });
  if (name == "keys") {
    return Fn([obj](auto&, Env&) {
      std::vector<ValuePtr> items;
      for (const auto& [k, v] : obj->entries) items.push_back(Str(k));
      return Array(std::move(items));
    });
  }
  if (name == "values") {
    return Fn([obj](auto&, Env&) {
      std::vector<ValuePtr> items;
      for (const auto& [k, v] : obj->entries) items.push_back(v);
      return Array(std::move(items));
    });
  }
  return nullptr;
}

ValuePtr Interpreter::Items(const Value& v) {
  std::vector<ValuePtr> items;
  for (const auto& [k, x] : v.object->entries) items.push_back(Array({Str(k), x}));
  return Array(std::move(items));
}

}  // namespace kvfleet::tok::jinja
