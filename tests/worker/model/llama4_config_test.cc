// Llama 4's config.json (llama4_config.h): Llama4ForCausalLM with transformers' defaults,
// Scout's explicit lists, Llama4ForConditionalGeneration's text_config, and errors that
// name the field.
#include <doctest/doctest.h>

#include <string>

#include "worker/model/model_config.h"

namespace kvfleet::model {
namespace {

std::string Text(const std::string& extra = "") {
  return R"({"architectures": ["Llama4ForCausalLM"], "model_type": "llama4_text", "vocab_size": 1000,
    "hidden_size": 64, "intermediate_size": 32, "intermediate_size_mlp": 128, "num_hidden_layers": 8,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-5)" +
         extra + "}";
}

TEST_CASE("Llama4ForCausalLM with transformers' defaults") {
  auto c = ParseModelConfig(Text());
  REQUIRE_MESSAGE(c.ok(), c.status().ToString());
  CHECK(c->architecture == Architecture::kLlama4);
  CHECK(c->intermediate_size == 128);  // the dense layers' (intermediate_size_mlp)
  CHECK(c->moe.expert_intermediate == 32);
  CHECK(c->moe.shared_expert_intermediate == 32);
  CHECK(c->moe.num_experts == 16);
  CHECK(c->moe.experts_per_token == 1);
  CHECK(c->moe.sigmoid_routing);
  CHECK(c->moe.layer_sparse == std::vector<bool>(8, true));  // interleave_moe_layer_step 1
  // Every 4th layer NoPE (no_rope_layer_interval 4), chunked attention on the others.
  const std::vector<bool> nope{false, false, false, true, false, false, false, true};
  CHECK(c->layer_nope == nope);
  CHECK(c->layer_chunked == std::vector<bool>{true, true, true, false, true, true, true, false});
  CHECK(c->attention_chunk_size == 8192);
  CHECK(c->rope_interleaved);
  CHECK(c->rope().interleaved);
  CHECK(c->qk_l2_norm);
  CHECK_FALSE(c->qk_norm);  // no q_norm/k_norm weights
  CHECK(c->attn_temperature_tuning);
  CHECK(c->floor_scale == 8192);
  CHECK(c->attn_scale == doctest::Approx(0.1));
  CHECK(c->rope_theta == 500000.0);
  CHECK(c->tensor_prefix.empty());
}

TEST_CASE("Llama 4: explicit moe_layers, no_rope_layers, layer_types; Scout's numeric temperature flag") {
  auto c = ParseModelConfig(Text(R"(, "moe_layers": [1, 3, 5, 7], "no_rope_layers": [1, 1, 0, 1, 1, 1, 0, 1, 1],
    "layer_types": ["chunked_attention", "full_attention", "full_attention", "chunked_attention",
                    "chunked_attention", "chunked_attention", "full_attention", "chunked_attention"],
    "attn_temperature_tuning": 4, "use_qk_norm": false, "attention_chunk_size": null,
    "rope_scaling": {"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192})"));
  REQUIRE_MESSAGE(c.ok(), c.status().ToString());
  CHECK(c->moe.layer_sparse == std::vector<bool>{false, true, false, true, false, true, false, true});
  CHECK(c->layer_nope == std::vector<bool>{false, false, true, false, false, false, true, false});
  CHECK(c->layer_chunked == std::vector<bool>{true, false, false, true, true, true, false, true});
  CHECK(c->attention_chunk_size == 0);  // null: no chunking
  CHECK(c->attn_temperature_tuning);
  CHECK_FALSE(c->qk_l2_norm);
  CHECK(c->rope_scaling.high_freq_factor == 1.0);  // equal factors, as Scout-Instruct's
}

TEST_CASE("Llama4ForConditionalGeneration: the text_config, tensors under language_model.") {
  const std::string text = Text(R"(, "eos_token_id": [200001, 200008])");
  auto c = ParseModelConfig(R"({"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
    "tie_word_embeddings": false, "vision_config": {"hidden_size": 1408}, "text_config": )" +
                            text + "}");
  REQUIRE_MESSAGE(c.ok(), c.status().ToString());
  CHECK(c->architecture == Architecture::kLlama4);
  CHECK(c->tensor_prefix == "language_model.");
  CHECK(c->eos_token_ids == std::vector<int64_t>{200001, 200008});
  CHECK(c->hidden_size == 64);
}

TEST_CASE("Llama 4 errors name the field") {
  auto fails = [](const std::string& json, const std::string& field) {
    auto c = ParseModelConfig(json);
    REQUIRE_FALSE(c.ok());
    CAPTURE(c.status().ToString());
    CHECK(c.status().message().find(field) != std::string::npos);
  };
  fails(Text(R"(, "moe_layers": [8])"), "moe_layers[0]");
  fails(Text(R"(, "no_rope_layers": [1, 0])"), "no_rope_layers");
  fails(Text(R"(, "no_rope_layers": [1, 1, 2, 1, 1, 1, 1, 1])"), "no_rope_layers[2]");
  fails(Text(R"(, "layer_types": ["sliding_attention"])"), "layer_types");
  fails(Text(R"(, "num_experts_per_tok": 17)"), "num_experts_per_tok");
  fails(Text(R"(, "interleave_moe_layer_step": 0)"), "interleave_moe_layer_step");
  fails(Text(R"(, "hidden_act": "gelu")"), "hidden_act");
  fails(R"({"architectures": ["Llama4ForConditionalGeneration"], "vision_config": {}})", "text_config");
  fails(R"({"architectures": ["Llama4ForConditionalGeneration"], "text_config": {"hidden_size": 64}})",
        "text_config.vocab_size");
  fails(R"({"architectures": ["Llama4ForConditionalGeneration"], "quantization_config": {"bits": 4},
    "text_config": {}})", "quantization_config");
}

}  // namespace
}  // namespace kvfleet::model
