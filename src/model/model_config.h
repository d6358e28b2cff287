// The shape of a model: GPT-2 (named configs gpt2 .. gpt2-xl and the small default) or the Llama
// family (Llama, Qwen2, Mistral: RMSNorm, rotary positions, SwiGLU, grouped-query attention;
// named configs of the published models), and the checks every config passes.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace layup {

enum class Architecture {
  kGpt2,   // pre-LN blocks, learned positions, GELU MLP, tied head, biases everywhere
  kLlama,  // pre-RMSNorm blocks, rotary positions, SwiGLU MLP, grouped-query attention
};

// Llama 3's stretch of the rotary frequencies (`rope_scaling` with rope_type "llama3"):
// wavelengths beyond original_max_position_embeddings / low_freq_factor are divided by
// `factor`, those below original / high_freq_factor kept, the band between blended.
struct RopeScaling {
  bool llama3 = false;  // false: the frequencies as rope_theta gives them
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position_embeddings = 8192;
};

struct ModelConfig {
  Architecture architecture = Architecture::kGpt2;
  int n_layer = 0;
  int n_head = 0;
  int n_embd = 0;
  int n_positions = 1024;  // the model's context: the longest sequence it has positions for
  int vocab_size = 50257;  // GPT-2's BPE vocabulary
  // The vocabulary rounded up to a multiple of 128 so the classifier matmul tiles evenly. The
  // padded rows of the token embedding stay zero and their logits are excluded from the loss.
  int padded_vocab_size = 50304;
  float layer_norm_epsilon = 1e-5f;  // GPT-2's layer norms, or the Llama family's rms_norm_eps

  // The Llama family's; GPT-2 leaves them at these values.
  int n_kv_head = 0;          // key/value heads of grouped-query attention (0: n_head)
  int head_size = 0;          // width of one head (0: n_embd / n_head)
  int intermediate_size = 0;  // the MLP's hidden width (0: 4 n_embd, GPT-2's)
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = true;     // the LM head is the token embedding (GPT-2: always)
  bool attention_bias = false;         // q, k and v projections have biases (Qwen2; Llama's flag)
  bool attention_output_bias = false;  // o_proj has one too (Llama's attention_bias; not Qwen2)
  int sliding_window = 0;              // attention sees at most this many positions back (0: all)
  std::string hf_model_type = "gpt2";  // config.json's model_type: gpt2, llama, qwen2, mistral

  bool is_llama() const { return architecture == Architecture::kLlama; }
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int head_dim() const { return head_size > 0 ? head_size : n_embd / n_head; }
  int mlp_width() const { return intermediate_size > 0 ? intermediate_size : 4 * n_embd; }
  // Floats of one token's q, k and v together: (n_head + 2 kv_heads) head_dim (GPT-2: 3 C).
  int qkv_width() const { return (n_head + 2 * kv_heads()) * head_dim(); }
};

// Rounds a vocabulary size up to the next multiple of 128.
int pad_vocab_size(int vocab_size);

// A GPT-2 of this shape, its vocabulary padded by pad_vocab_size: what the named GPT-2 configs are
// made of, and the small models of the tests.
ModelConfig gpt2_config(int n_layer, int n_head, int n_embd, int n_positions,
                        int vocab_size = 50257);

// gpt2 (124M), gpt2-medium (350M), gpt2-large (774M), gpt2-xl (1.5B), and "small", the default
// that shows learning within minutes on a 2-core CPU; the Llama family's published shapes:
// llama-3.2-1b, llama-3.2-3b, llama-3-8b, llama-2-13b, qwen2.5-0.5b, mistral-7b (v0.1), each as its
// config.json reads (context: its max_position_embeddings). Throws layup::Error for other names.
ModelConfig named_config(std::string_view name);
std::vector<std::string> named_config_names();

// A Llama-family model of this shape with the defaults of Llama's config.json (rope_theta 10000,
// rms_norm_eps 1e-6, untied head), its vocabulary padded by pad_vocab_size: for tests and
// `--layers/--heads/--dim` shapes of that family.
ModelConfig llama_config(int n_layer, int n_head, int n_kv_head, int n_embd, int intermediate_size,
                         int n_positions, int vocab_size);

// Throws layup::Error naming the first field that is out of range or inconsistent.
void validate_config(const ModelConfig& config);

// Throws layup::Error where sequences of seq_len tokens exceed the model's context, or its
// attention window (Mistral's sliding_window, which layup does not implement). Both backends ask.
void check_sequence_length(const ModelConfig& config, int seq_len);

// The first field whose value differs between two configs in a way that changes the parameters'
// shapes (named as config.json names it), with both values as text; nothing when the shapes agree.
struct ShapeDifference {
  std::string field, first, second;
};
std::optional<ShapeDifference> first_shape_difference(const ModelConfig& first,
                                                      const ModelConfig& second);

// Number of trainable parameters as Hugging Face counts them (unpadded vocabulary; a tied head
// counted once).
long long parameter_count(const ModelConfig& config);

}  // namespace layup
