// config.json parsing: the fields of each architecture, and errors that name the field.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "worker/model/model_config.h"

namespace kvfleet::model {
namespace {

std::string Llama(const std::string& extra = "") {
  return R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1000,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 8,
    "num_key_value_heads": 2, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "bos_token_id": 1, "eos_token_id": [2, 3])" +
         extra + "}";
}

TEST_CASE("a Llama 3 config: GQA, derived head_dim, eos list, no window") {
  auto c = ParseModelConfig(Llama());
  REQUIRE_MESSAGE(c.ok(), c.status().ToString());
  CHECK(c->architecture == Architecture::kLlama);
  CHECK(c->num_kv_heads == 2);
  CHECK(c->head_dim == 8);
  CHECK(c->rope_theta == 500000.0);
  CHECK(c->rms_norm_eps == doctest::Approx(1e-5));
  CHECK(c->eos_token_ids == std::vector<int64_t>{2, 3});
  CHECK(c->bos_token_id == 1);
  CHECK_FALSE(c->tie_word_embeddings);
  CHECK_FALSE(c->attention_bias);
  CHECK(c->layer_window == std::vector<int64_t>(4, 0));
  CHECK(c->rope_scaling.type == RopeScaling::Type::kNone);
}

TEST_CASE("llama3 rope_scaling, and the same under transformers 5's rope_parameters") {
  auto c = ParseModelConfig(Llama(R"(, "rope_scaling": {"rope_type": "llama3", "factor": 32.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})"));
  REQUIRE(c.ok());
  CHECK(c->rope_scaling.type == RopeScaling::Type::kLlama3);
  CHECK(c->rope_scaling.factor == 32.0);
  CHECK(c->rope_scaling.original_max_position_embeddings == 8192);

  std::string v5 = Llama(R"(, "rope_parameters": {"rope_type": "llama3", "rope_theta": 123.0, "factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})");
  v5.replace(v5.find("\"rope_theta\": 500000.0,"), std::string("\"rope_theta\": 500000.0,").size(), "");
  auto d = ParseModelConfig(v5);
  REQUIRE_MESSAGE(d.ok(), d.status().ToString());
  CHECK(d->rope_scaling.factor == 8.0);
  CHECK(d->rope_theta == 123.0);
}

TEST_CASE("an unknown rope_type is refused, naming the field and the supported types") {
  for (const char* type : {"longrope", "su", "mrope"}) {
    auto c = ParseModelConfig(
        Llama(std::string(R"(, "rope_scaling": {"rope_type": ")") + type + R"(", "factor": 4.0})"));
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == StatusCode::kUnimplemented);
    CHECK(c.status().message().find("rope_scaling.rope_type") != std::string::npos);
    CHECK(c.status().message().find(type) != std::string::npos);
    CHECK(c.status().message().find("yarn") != std::string::npos);  // the supported list
  }
  auto v5 = ParseModelConfig(Llama(R"(, "rope_parameters": {"rope_type": "longrope", "factor": 4.0})"));
  REQUIRE_FALSE(v5.ok());
  CHECK(v5.status().message().find("rope_parameters.rope_type") != std::string::npos);
}

TEST_CASE("yarn: its fields, HF's defaults, and transformers 5's factor from the two lengths") {
  auto c = ParseModelConfig(Llama(R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
      "original_max_position_embeddings": 512, "beta_fast": 16, "beta_slow": 2, "mscale": 0.707,
      "mscale_all_dim": 0.707, "truncate": false})"));
  REQUIRE_MESSAGE(c.ok(), c.status().ToString());
  const RopeScaling& y = c->rope_scaling;
  CHECK(y.type == RopeScaling::Type::kYarn);
  CHECK(y.factor == 4.0);
  CHECK(y.original_max_position_embeddings == 512);
  CHECK(y.beta_fast == 16.0);
  CHECK(y.beta_slow == 2.0);
  CHECK(y.mscale == doctest::Approx(0.707));
  CHECK_FALSE(y.truncate);
  CHECK_FALSE(y.attention_factor.has_value());

  // Absent (or null, or 0 for the betas, as HF's `or`) fields take HF's defaults; the
  // original length defaults to max_position_embeddings.
  auto d = ParseModelConfig(Llama(R"(, "rope_scaling": {"type": "yarn", "factor": 2.0, "beta_fast": 0,
      "beta_slow": null, "attention_factor": 0.5})"));
  REQUIRE_MESSAGE(d.ok(), d.status().ToString());
  CHECK(d->rope_scaling.beta_fast == 32.0);
  CHECK(d->rope_scaling.beta_slow == 1.0);
  CHECK(d->rope_scaling.original_max_position_embeddings == 2048);
  CHECK(d->rope_scaling.truncate);
  CHECK(d->rope_scaling.attention_factor == 0.5);

  // No factor: max_position_embeddings / original_max_position_embeddings (transformers 5).
  auto e = ParseModelConfig(
      Llama(R"(, "rope_parameters": {"rope_type": "yarn", "original_max_position_embeddings": 512})"));
  REQUIRE_MESSAGE(e.ok(), e.status().ToString());
  CHECK(e->rope_scaling.factor == 4.0);
  // A top-level original_max_position_embeddings wins over the dict's (Phi-3 style).
  auto f = ParseModelConfig(Llama(R"(, "original_max_position_embeddings": 1024,
      "rope_scaling": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 512})"));
  REQUIRE(f.ok());
  CHECK(f->rope_scaling.original_max_position_embeddings == 1024);
  // The model's RoPE config carries it all to kernels/rope.h.
  const kernels::RopeConfig rope = f->rope();
  CHECK(rope.head_dim == 8);
  CHECK(rope.theta == 500000.0);
  CHECK(rope.max_position_embeddings == 2048);
  CHECK(rope.scaling.type == RopeScaling::Type::kYarn);
}

TEST_CASE("dynamic: the factor, required like every scaled type's") {
  auto c = ParseModelConfig(Llama(R"(, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0})"));
  REQUIRE_MESSAGE(c.ok(), c.status().ToString());
  CHECK(c->rope_scaling.type == RopeScaling::Type::kDynamic);
  CHECK(c->rope_scaling.factor == 2.0);
  for (const char* type : {"dynamic", "linear", "llama3"}) {
    auto m = ParseModelConfig(Llama(std::string(R"(, "rope_scaling": {"rope_type": ")") + type + R"("})"));
    REQUIRE_FALSE(m.ok());
    CHECK_MESSAGE(m.status().message() == "config.json: rope_scaling.factor: missing", m.status().message());
  }
}

TEST_CASE("bad rope fields are refused, naming the field") {
  struct Case {
    const char* extra;
    const char* field;
  };
  for (Case k : {Case{R"("rope_scaling": {"rope_type": "yarn", "factor": 0.5})", "rope_scaling.factor"},
                 Case{R"("rope_scaling": {"rope_type": "dynamic", "factor": "2"})", "rope_scaling.factor"},
                 Case{R"("rope_scaling": {"rope_type": "yarn", "factor": 2, "beta_fast": -1})",
                      "rope_scaling.beta_fast"},
                 Case{R"("rope_scaling": {"rope_type": "yarn", "factor": 2, "attention_factor": 0})",
                      "rope_scaling.attention_factor"},
                 Case{R"("rope_scaling": {"rope_type": "yarn", "factor": 2, "truncate": 1})", "rope_scaling.truncate"},
                 Case{R"("rope_scaling": {"rope_type": "yarn", "original_max_position_embeddings": 0})",
                      "rope_scaling.original_max_position_embeddings"},
                 Case{R"("rope_scaling": {"rope_type": "yarn"})", "rope_scaling.factor"},
                 Case{R"("rope_scaling": {"factor": 2})", "rope_scaling.rope_type"},
                 Case{R"("rope_scaling": {"rope_type": "llama3", "factor": 8})",
                      "rope_scaling.original_max_position_embeddings"},
                 Case{R"("partial_rotary_factor": 0.5)", "partial_rotary_factor"},
                 Case{R"("rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.25})",
                      "rope_parameters.partial_rotary_factor"},
                 Case{R"("hidden_act": 7)", "hidden_act"}}) {
    auto c = ParseModelConfig(Llama(std::string(", ") + k.extra));
    REQUIRE_FALSE(c.ok());
    CHECK_MESSAGE(c.status().message().find(std::string("config.json: ") + k.field + ":") != std::string::npos,
                  k.extra << " -> " << c.status().message());
  }
  CHECK(ParseModelConfig(Llama(R"(, "partial_rotary_factor": 1.0)")).ok());  // every dim rotated: fine
}

TEST_CASE("Qwen2: QKV bias always; the window only with use_sliding_window, above max_window_layers") {
  std::string q = Llama(R"(, "sliding_window": 4096, "max_window_layers": 2, "tie_word_embeddings": true)");
  q.replace(q.find("LlamaForCausalLM"), 16, "Qwen2ForCausalLM");
  auto off = ParseModelConfig(q);
  REQUIRE(off.ok());
  CHECK(off->attention_bias);
  CHECK_FALSE(off->attention_out_bias);
  CHECK(off->tie_word_embeddings);
  CHECK_FALSE(off->has_sliding_window());

  q.insert(q.size() - 1, R"(, "use_sliding_window": true)");
  auto on = ParseModelConfig(q);
  REQUIRE(on.ok());
  CHECK(on->layer_window == std::vector<int64_t>{0, 0, 4096, 4096});
}

// `text` with its first `from` replaced by `to`.
std::string Replaced(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

// Qwen/Qwen3-8B's config.json, as the repository has it.
std::string Qwen3Config(const std::string& extra = "") {
  return R"({"architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 12288, "max_position_embeddings": 40960,
    "max_window_layers": 36, "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 36,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
    "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false, "vocab_size": 151936)" +
         extra + "}";
}

TEST_CASE("Qwen3: q_norm/k_norm, a head_dim of its own, no bias unless attention_bias (then on o too)") {
  auto c = ParseModelConfig(Qwen3Config());
  REQUIRE_MESSAGE(c.ok(), c.status().ToString());
  CHECK(c->architecture == Architecture::kQwen3);
  CHECK(ArchitectureName(c->architecture) == "Qwen3ForCausalLM");
  CHECK(c->qk_norm);
  CHECK(c->head_dim == 128);
  CHECK(c->q_size() == 4096);
  CHECK(c->kv_size() == 1024);
  CHECK_FALSE(c->attention_bias);
  CHECK_FALSE(c->attention_out_bias);
  CHECK_FALSE(c->mlp_bias);
  CHECK_FALSE(c->has_sliding_window());
  CHECK(c->rope_theta == 1e6);
  CHECK(c->rope_scaling.type == RopeScaling::Type::kNone);
  CHECK(c->eos_token_ids == std::vector<int64_t>{151645});

  // The model card's long-context setting.
  auto y = ParseModelConfig(Replaced(Qwen3Config(), R"("rope_scaling": null)",
      R"("rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})"));
  REQUIRE_MESSAGE(y.ok(), y.status().ToString());
  CHECK(y->rope_scaling.type == RopeScaling::Type::kYarn);
  CHECK(y->rope_scaling.factor == 4.0);  // the explicit factor, not 40960 / 32768 (transformers 5)
  CHECK(y->rope_scaling.original_max_position_embeddings == 32768);

  auto b = ParseModelConfig(Replaced(Qwen3Config(), R"("attention_bias": false)", R"("attention_bias": true)"));
  REQUIRE(b.ok());
  CHECK(b->attention_bias);
  CHECK(b->attention_out_bias);

  std::string windowed = Replaced(Qwen3Config(), R"("sliding_window": null)", R"("sliding_window": 4096)");
  windowed = Replaced(windowed, R"("use_sliding_window": false)", R"("use_sliding_window": true)");
  auto w = ParseModelConfig(Replaced(windowed, R"("max_window_layers": 36)", R"("max_window_layers": 34)"));
  REQUIRE(w.ok());
  CHECK(w->layer_window[33] == 0);
  CHECK(w->layer_window[34] == 4096);
  CHECK(w->layer_window[35] == 4096);
}

TEST_CASE("Mistral: the window on every layer; a per-layer list or layer_types where given") {
  std::string m = Llama(R"(, "sliding_window": 4096, "head_dim": 16)");
  m.replace(m.find("LlamaForCausalLM"), 16, "MistralForCausalLM");
  auto c = ParseModelConfig(m);
  REQUIRE(c.ok());
  CHECK(c->layer_window == std::vector<int64_t>(4, 4096));
  CHECK(c->head_dim == 16);

  auto list = ParseModelConfig(Llama(R"(, "sliding_window": [128, null, 128, 0])"));
  REQUIRE(list.ok());
  CHECK(list->layer_window == std::vector<int64_t>{128, 0, 128, 0});

  auto types = ParseModelConfig(Llama(R"(, "sliding_window": 64, "layer_types":
      ["sliding_attention", "full_attention", "sliding_attention", "full_attention"])"));
  REQUIRE(types.ok());
  CHECK(types->layer_window == std::vector<int64_t>{64, 0, 64, 0});

  auto bad = ParseModelConfig(Llama(R"(, "sliding_window": [1, 2])"));
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("sliding_window") != std::string::npos);
}

TEST_CASE("an unsupported architecture is refused by name") {
  std::string g = Llama();
  g.replace(g.find("LlamaForCausalLM"), 16, "GPT2LMHeadModel");
  auto c = ParseModelConfig(g);
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().code() == StatusCode::kUnimplemented);
  CHECK(c.status().message().find("architectures") != std::string::npos);
  CHECK(c.status().message().find("GPT2LMHeadModel") != std::string::npos);
}

// mistralai/Mixtral-8x7B-v0.1's config.json.
std::string Mixtral(const std::string& extra = "") {
  return R"({"architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
    "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "num_local_experts": 8, "output_router_logits": false, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02, "sliding_window": null, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "use_cache": true, "vocab_size": 32000)" +
         extra + "}";
}

// Qwen/Qwen3-30B-A3B's config.json.
std::string Qwen3Moe(const std::string& extra = "") {
  return R"({"architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
    "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe",
    "moe_intermediate_size": 768, "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": false,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
    "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
    "use_sliding_window": false, "vocab_size": 151936)" +
         extra + "}";
}

// `json` with `"field": value,` (the field's first occurrence, and its comma) taken out.
std::string Without(std::string json, const std::string& field) {
  const size_t at = json.find("\"" + field + "\":");
  REQUIRE(at != std::string::npos);
  json.erase(at, json.find(',', at) + 1 - at);
  return json;
}

TEST_CASE("Mixtral: every layer a MoE block of intermediate_size experts, top-k always renormalised") {
  auto c = ParseModelConfig(Mixtral());
  REQUIRE_MESSAGE(c.ok(), c.status().ToString());
  CHECK(c->architecture == Architecture::kMixtral);
  CHECK(ArchitectureName(c->architecture) == "MixtralForCausalLM");
  CHECK(c->is_moe());
  CHECK(c->moe.num_experts == 8);
  CHECK(c->moe.experts_per_token == 2);
  CHECK(c->moe.expert_intermediate == 14336);
  CHECK(c->moe.norm_topk_prob);
  for (int64_t l = 0; l < 32; ++l) CHECK(c->sparse_layer(l));
  CHECK_FALSE(c->qk_norm);
  CHECK_FALSE(c->attention_bias);
  CHECK_FALSE(c->has_sliding_window());
  CHECK(c->head_dim == 128);
  // Mixtral's sliding window is Mistral's: every layer.
  std::string sw = Mixtral();
  sw.replace(sw.find("\"sliding_window\": null"), 22, "\"sliding_window\": 4096");
  auto w = ParseModelConfig(sw);
  REQUIRE_MESSAGE(w.ok(), w.status().ToString());
  CHECK(w->layer_window == std::vector<int64_t>(32, 4096));
  // norm_topk_prob is not Mixtral's: MixtralTopKRouter renormalises whatever it says.
  auto n = ParseModelConfig(Mixtral(R"(, "norm_topk_prob": false)"));
  REQUIRE(n.ok());
  CHECK(n->moe.norm_topk_prob);
  // HF's defaults for absent fields: 8 experts, top-2.
  auto d = ParseModelConfig(Without(Without(Mixtral(), "num_local_experts"), "num_experts_per_tok"));
  REQUIRE_MESSAGE(d.ok(), d.status().ToString());
  CHECK(d->moe.num_experts == 8);
  CHECK(d->moe.experts_per_token == 2);
}

TEST_CASE("Qwen3-MoE: Qwen3's attention, experts of moe_intermediate_size, norm_topk_prob as given") {
  auto c = ParseModelConfig(Qwen3Moe());
  REQUIRE_MESSAGE(c.ok(), c.status().ToString());
  CHECK(c->architecture == Architecture::kQwen3Moe);
  CHECK(c->model_type == "qwen3_moe");
  CHECK(c->qk_norm);
  CHECK(c->head_dim == 128);
  CHECK(c->moe.num_experts == 128);
  CHECK(c->moe.experts_per_token == 8);
  CHECK(c->moe.expert_intermediate == 768);
  CHECK(c->intermediate_size == 6144);
  CHECK(c->moe.norm_topk_prob);
  for (int64_t l = 0; l < 48; ++l) CHECK(c->sparse_layer(l));
  CHECK_FALSE(c->has_sliding_window());
  // HF's defaults: norm_topk_prob false, moe_intermediate_size 768, 128 experts, top-8.
  auto d = ParseModelConfig(Without(Without(Without(Qwen3Moe(), "norm_topk_prob"), "num_experts"), "moe_intermediate_size"));
  REQUIRE_MESSAGE(d.ok(), d.status().ToString());
  CHECK_FALSE(d->moe.norm_topk_prob);
  CHECK(d->moe.num_experts == 128);
  CHECK(d->moe.expert_intermediate == 768);
  // use_sliding_window puts the window on every layer (Qwen3-MoE does not read max_window_layers).
  std::string sw = Qwen3Moe();
  sw.replace(sw.find("\"use_sliding_window\": false"), 27, "\"use_sliding_window\": true");
  sw.replace(sw.find("\"sliding_window\": null"), 22, "\"sliding_window\": 4096");
  sw.replace(sw.find("\"max_window_layers\": 48"), 23, "\"max_window_layers\": 40");
  auto w = ParseModelConfig(sw);
  REQUIRE_MESSAGE(w.ok(), w.status().ToString());
  CHECK(w->layer_window == std::vector<int64_t>(48, 4096));
}

TEST_CASE("Qwen3-MoE: mlp_only_layers and decoder_sparse_step choose the dense layers, as HF's decoder layer does") {
  // Sparse when not in mlp_only_layers and (l + 1) % decoder_sparse_step == 0.
  auto c = ParseModelConfig(Without(Without(Qwen3Moe(R"(, "mlp_only_layers": [0, 5], "decoder_sparse_step": 2)"),
                                            "mlp_only_layers"),
                                    "decoder_sparse_step"));
  REQUIRE_MESSAGE(c.ok(), c.status().ToString());
  for (int64_t l = 0; l < 48; ++l) {
    INFO("layer " << l);
    CHECK(c->sparse_layer(l) == (l != 0 && l != 5 && (l + 1) % 2 == 0));
  }
  CHECK_FALSE(c->sparse_layer(5));
  CHECK(c->sparse_layer(3));
  // num_experts 0: a dense model, as HF builds every layer's MLP then.
  std::string dense = Qwen3Moe();
  dense.replace(dense.find("\"num_experts\": 128"), 18, "\"num_experts\": 0");
  auto d = ParseModelConfig(dense);
  REQUIRE_MESSAGE(d.ok(), d.status().ToString());
  CHECK_FALSE(d->is_moe());
  CHECK_FALSE(d->sparse_layer(0));
}

TEST_CASE("bad MoE fields are refused, naming the field") {
  auto refused = [](const std::string& json, const std::string& field) {
    auto c = ParseModelConfig(json);
    REQUIRE_FALSE(c.ok());
    CHECK_MESSAGE(c.status().message().find(field) != std::string::npos, c.status().message());
  };
  auto edit = [](std::string json, const std::string& from, const std::string& to) {
    json.replace(json.find(from), from.size(), to);
    return json;
  };
  refused(edit(Qwen3Moe(), "\"num_experts_per_tok\": 8", "\"num_experts_per_tok\": 129"), "num_experts_per_tok");
  refused(edit(Qwen3Moe(), "\"num_experts_per_tok\": 8", "\"num_experts_per_tok\": 0"), "num_experts_per_tok");
  refused(edit(Mixtral(), "\"num_local_experts\": 8", "\"num_local_experts\": 0"), "num_local_experts");
  refused(edit(Mixtral(), "\"num_local_experts\": 8", "\"num_local_experts\": \"8\""), "num_local_experts");
  refused(edit(Qwen3Moe(), "\"moe_intermediate_size\": 768", "\"moe_intermediate_size\": -1"), "moe_intermediate_size");
  refused(edit(Qwen3Moe(), "\"decoder_sparse_step\": 1", "\"decoder_sparse_step\": 0"), "decoder_sparse_step");
  refused(edit(Qwen3Moe(), "\"mlp_only_layers\": []", "\"mlp_only_layers\": [48]"), "mlp_only_layers[0]");
  refused(edit(Qwen3Moe(), "\"mlp_only_layers\": []", "\"mlp_only_layers\": 3"), "mlp_only_layers");
  refused(edit(Qwen3Moe(), "\"norm_topk_prob\": true", "\"norm_topk_prob\": 1"), "norm_topk_prob");
}

TEST_CASE("what neither Mixtral nor Qwen3-MoE computes is refused at start-up, naming the field") {
  auto unimplemented = [](const std::string& json, const std::string& field) {
    auto c = ParseModelConfig(json);
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == StatusCode::kUnimplemented);
    CHECK_MESSAGE(c.status().message().find("config.json: " + field) != std::string::npos, c.status().message());
  };
  // Quantized experts (or anything quantized), on any architecture.
  unimplemented(Mixtral(R"(, "quantization_config": {"quant_method": "fp8", "modules_to_not_convert": ["gate"]})"),
                "quantization_config");
  unimplemented(Llama(R"(, "quantization_config": {"quant_method": "awq", "bits": 4})"), "quantization_config");
  // Routers of other MoE families.
  unimplemented(Qwen3Moe(R"(, "scoring_func": "sigmoid")"), "scoring_func");
  unimplemented(Qwen3Moe(R"(, "topk_method": "noaux_tc")"), "topk_method");
  unimplemented(Qwen3Moe(R"(, "n_group": 8, "topk_group": 4)"), "n_group");
  unimplemented(Qwen3Moe(R"(, "routed_scaling_factor": 2.5)"), "routed_scaling_factor");
  unimplemented(Qwen3Moe(R"(, "n_shared_experts": 1)"), "n_shared_experts");
  // Qwen2-MoE's shared expert: HF's Qwen3MoeSparseMoeBlock has none, so weights for one
  // would be dropped; 0 says there is none and is accepted.
  unimplemented(Qwen3Moe(R"(, "shared_expert_intermediate_size": 5632)"), "shared_expert_intermediate_size");
  CHECK(ParseModelConfig(Qwen3Moe(R"(, "shared_expert_intermediate_size": 0, "scoring_func": "softmax")")).ok());
  // Multimodal configs: text-only *ForCausalLM only.
  unimplemented(Qwen3Moe(R"(, "vision_config": {"depth": 27})"), "vision_config");
  unimplemented(Llama(R"(, "text_config": {"hidden_size": 64})"), "text_config");
  // Qwen2-MoE and DeepSeek are other architectures (Llama 4: llama4_config_test.cc).
  for (const char* arch : {"Qwen2MoeForCausalLM", "DeepseekV3ForCausalLM"}) {
    std::string j = Qwen3Moe();
    j.replace(j.find("Qwen3MoeForCausalLM"), 19, arch);
    unimplemented(j, "architectures");
  }
}

TEST_CASE("missing and malformed fields are named") {
  std::string m = Llama();
  m.replace(m.find("\"num_attention_heads\": 8,"), std::string("\"num_attention_heads\": 8,").size(), "");
  auto c = ParseModelConfig(m);
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().message() == "config.json: num_attention_heads: missing");

  auto d = ParseModelConfig(Llama(R"(, "num_key_value_heads": 3)"));  // a later duplicate key wins
  REQUIRE_FALSE(d.ok());
  CHECK(d.status().message().find("num_key_value_heads") != std::string::npos);

  auto e = ParseModelConfig(Llama(R"(, "hidden_act": "gelu")"));
  REQUIRE_FALSE(e.ok());
  CHECK(e.status().message().find("hidden_act") != std::string::npos);

  CHECK_FALSE(ParseModelConfig("{not json").ok());
  CHECK_FALSE(ParseModelConfig("[1, 2]").ok());
}

// A model directory in a temporary folder, removed at the end.
struct ModelDir {
  explicit ModelDir(const std::string& tag)
      : path(std::filesystem::temp_directory_path() / ("kvfleet-cfg-" + tag + "-" + std::to_string(::getpid()))) {
    std::filesystem::create_directories(path);
  }
  ~ModelDir() { std::filesystem::remove_all(path); }
  void Write(const std::string& name, const std::string& text) const { std::ofstream(path / name) << text; }
  std::filesystem::path path;
};

// Meta-Llama-3-8B-Instruct's two files, their eos fields as the repository has them.
std::string Llama3InstructConfig() {
  return R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "max_position_embeddings": 8192, "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0, "bos_token_id": 128000, "eos_token_id": 128001, "torch_dtype": "bfloat16"})";
}
constexpr const char* kLlama3InstructGeneration =
    R"({"bos_token_id": 128000, "eos_token_id": [128001, 128009], "do_sample": true,
        "temperature": 0.6, "max_length": 4096, "top_p": 0.9, "transformers_version": "4.40.0.dev0"})";

TEST_CASE("Llama-3-8B-Instruct's layout: the eos set is config.json's 128001 and generation_config's 128009") {
  ModelDir dir("llama3-instruct");
  dir.Write("config.json", Llama3InstructConfig());
  dir.Write("generation_config.json", kLlama3InstructGeneration);
  auto c = LoadModelConfig(dir.path.string());
  REQUIRE_MESSAGE(c.ok(), c.status().ToString());
  CHECK(c->eos_token_ids == std::vector<int64_t>{128001, 128009});
}

TEST_CASE("without generation_config.json the eos set is config.json's alone") {
  ModelDir dir("no-generation");
  dir.Write("config.json", Llama3InstructConfig());
  auto c = LoadModelConfig(dir.path.string());
  REQUIRE_MESSAGE(c.ok(), c.status().ToString());
  CHECK(c->eos_token_ids == std::vector<int64_t>{128001});
}

TEST_CASE("a malformed generation_config.json is refused, naming the file and the field") {
  ModelDir dir("bad-generation");
  dir.Write("config.json", Llama3InstructConfig());
  for (const char* text : {R"({"eos_token_id": "</s>"})", R"({"eos_token_id": [128001, "x"]})",
                           R"({"eos_token_id": [-5]})"}) {
    dir.Write("generation_config.json", text);
    auto c = LoadModelConfig(dir.path.string());
    REQUIRE_FALSE(c.ok());
    CHECK_MESSAGE(c.status().message().find("generation_config.json: eos_token_id") != std::string::npos,
                  c.status().message());
  }
  dir.Write("generation_config.json", "{\"eos_token_id\": ");
  auto c = LoadModelConfig(dir.path.string());
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().message().find("generation_config.json: not valid JSON") != std::string::npos);
}

}  // namespace
}  // namespace kvfleet::model
