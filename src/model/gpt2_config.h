// The shape of a GPT-2 model: named configs (gpt2 .. gpt2-xl, and the small default) and checks.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace layup {

struct Gpt2Config {
  int n_layer = 0;
  int n_head = 0;
  int n_embd = 0;
  int n_positions = 1024;  // the model's context: the longest sequence it has positions for
  int vocab_size = 50257;  // GPT-2's BPE vocabulary
  // The vocabulary rounded up to a multiple of 128 so the classifier matmul tiles evenly. The
  // padded rows of the token embedding stay zero and their logits are excluded from the loss.
  int padded_vocab_size = 50304;
  float layer_norm_epsilon = 1e-5f;

  int head_dim() const { return n_embd / n_head; }
};

// Rounds a vocabulary size up to the next multiple of 128.
int pad_vocab_size(int vocab_size);

// A GPT-2 of this shape, its vocabulary padded by pad_vocab_size: what the named configs are made
// of, and the small models of the tests.
Gpt2Config gpt2_config(int n_layer, int n_head, int n_embd, int n_positions,
                       int vocab_size = 50257);

// gpt2 (124M), gpt2-medium (350M), gpt2-large (774M), gpt2-xl (1.5B), and "small", the default
// that shows learning within minutes on a 2-core CPU. Throws layup::Error for other names.
Gpt2Config named_config(std::string_view name);
std::vector<std::string> named_config_names();

// Throws layup::Error naming the first field that is out of range or inconsistent.
void validate_config(const Gpt2Config& config);

// Number of trainable parameters as GPT-2 counts them (unpadded vocabulary, tied head).
long long parameter_count(const Gpt2Config& config);

}  // namespace layup
