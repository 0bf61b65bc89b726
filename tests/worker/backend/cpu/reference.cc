#include "tests/worker/backend/cpu/reference.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace kvfleet::testing {

namespace {
[[noreturn]] void Die(const std::string& m) {
  std::fprintf(stderr, "FATAL: %s\n", m.c_str());
  std::abort();
}
}  // namespace

std::vector<std::string> TinyReferenceModels(const std::string& dir) {
  std::vector<std::string> names = {"tiny", "tiny-qwen2", "tiny-mistral", "tiny-qwen3"};
  for (const std::string& name : names) {
    if (!Reference::Exists(dir, name)) Die(dir + "/" + name + ".json is missing (tests/data/model/README.md)");
  }
  return names;
}

std::vector<std::string> TinyMoeReferenceModels(const std::string& dir) {
  std::vector<std::string> present;
  for (const char* name : {"tiny-mixtral", "tiny-qwen3-moe"}) {
    if (Reference::Exists(dir, name)) {
      present.push_back(name);
    } else {
      std::fprintf(stderr,
                   "SKIPPED: %s/%s.json is missing: the cpu backend's %s is not compared with transformers "
                   "(tests/data/model/README.md says how to make it)\n",
                   dir.c_str(), name, name);
    }
  }
  return present;
}

bool Reference::Exists(const std::string& dir, const std::string& name) {
  return std::ifstream(dir + "/" + name + ".json").good();
}

Reference Reference::Load(const std::string& dir, const std::string& name) {
  std::ifstream in(dir + "/" + name + ".json");
  if (!in) Die("no reference " + dir + "/" + name + ".json");
  std::stringstream ss;
  ss << in.rdbuf();
  auto j = nlohmann::json::parse(ss.str());
  Reference r;
  r.name = j["name"];
  r.shape = j["shape"];
  r.seed = j["seed"];
  r.vocab = j["vocab_size"];
  r.top_k = j["top_k"];
  r.hf_bf16_rows_over = j.value("hf_bf16_rows_over", int64_t{-1});
  for (const auto& p : j["prompts"]) r.prompts.push_back(p.get<std::vector<TokenId>>());
  for (const auto& g : j["greedy"]) r.greedy.push_back(g.get<std::vector<TokenId>>());
  r.top_ids = j["top_ids"].get<std::vector<std::vector<std::vector<int64_t>>>>();
  r.stride_columns = j["stride_columns"].get<std::vector<int64_t>>();
  int64_t rows = 0;
  for (size_t p = 0; p < r.prompts.size(); ++p) {
    r.row0.push_back(rows);
    rows += static_cast<int64_t>(r.prompts[p].size() + r.greedy[p].size());
  }
  const int64_t width = r.top_k + static_cast<int64_t>(r.stride_columns.size());
  r.values.resize(rows * width);
  std::ifstream f(dir + "/" + name + ".logits.f32", std::ios::binary);
  f.read(reinterpret_cast<char*>(r.values.data()), static_cast<std::streamsize>(r.values.size() * sizeof(float)));
  if (!f || f.peek() != EOF) Die(dir + "/" + name + ".logits.f32: not " + std::to_string(rows) + " rows");
  return r;
}

float Reference::MaxDiff(size_t p, int64_t position, std::span<const float> logits) const {
  const int64_t width = top_k + static_cast<int64_t>(stride_columns.size());
  const float* want = &values[(row0[p] + position) * width];
  float d = 0;
  for (int64_t k = 0; k < top_k; ++k) d = std::max(d, std::fabs(logits[top_ids[p][position][k]] - want[k]));
  for (size_t k = 0; k < stride_columns.size(); ++k) {
    d = std::max(d, std::fabs(logits[stride_columns[k]] - want[top_k + k]));
  }
  return d;
}

bool Replay(backend::ModelBackend& b, std::vector<ReplaySeq*> seqs) {
  const int64_t B = b.block_size();
  const int64_t window = b.pools()[0].window;
  const int64_t vocab = b.config().vocab_size;
  for (;;) {
    backend::StepBatch batch;
    std::vector<ReplaySeq*> in_step;
    std::vector<int64_t> lens;
    std::vector<TokenId> decode_tokens(seqs.size());
    for (ReplaySeq* s : seqs) {
      if (s->done) continue;
      const auto& prompt = s->ref->prompts[s->prompt];
      backend::SequenceStep step;
      step.request_id = in_step.size();
      step.start_position = s->pos;
      step.logits = backend::LogitsRequest::kAll;
      if (s->pos < s->prompt_len()) {
        const int64_t len = std::min(s->chunk > 0 ? s->chunk : s->prompt_len(), s->prompt_len() - s->pos);
        step.tokens = std::span<const TokenId>(prompt).subspan(s->pos, len);
        step.sample = s->pos + len == s->prompt_len();
        lens.push_back(len);
      } else {
        decode_tokens[in_step.size()] = s->generated.back();
        step.tokens = std::span<const TokenId>(&decode_tokens[in_step.size()], 1);
        step.sample = true;
        lens.push_back(1);
      }
      if (s->drop_behind_window && window > 0) {
        // Blocks wholly before the first query's window, like the KV manager frees them.
        const int64_t first_visible = s->pos - window + 1;
        for (int64_t blk = 0; (blk + 1) * B <= first_visible; ++blk) s->table[blk] = backend::kNoBlock;
      }
      step.block_tables = {s->table};
      batch.seqs.push_back(step);
      in_step.push_back(s);
    }
    if (in_step.empty()) return true;
    backend::StepOutput out;
    Status st = b.Execute(batch, &out);
    CHECK_MESSAGE(st.ok(), st.ToString());
    if (!st.ok()) return false;
    for (size_t i = 0; i < in_step.size(); ++i) {
      ReplaySeq* s = in_step[i];
      for (int64_t j = 0; j < lens[i]; ++j) {
        std::span<const float> row(&out.logits[(out.logits_offset[i] + j) * vocab], vocab);
        s->max_diff = std::max(s->max_diff, s->ref->MaxDiff(s->prompt, s->pos + j, row));
        ++s->rows_checked;
      }
      s->pos += lens[i];
      if (batch.seqs[i].sample) {
        if (s->generated.size() == s->ref->greedy[s->prompt].size()) {
          s->done = true;  // this step only checked the last reference row
        } else {
          s->generated.push_back(out.tokens[i]);
        }
      }
    }
  }
}

}  // namespace kvfleet::testing
