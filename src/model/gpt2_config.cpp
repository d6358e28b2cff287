// Named GPT-2 configs and their validation.
#include "model/gpt2_config.h"

#include "core/error.h"

namespace layup {

int pad_vocab_size(int vocab_size) {
  return (vocab_size + 127) / 128 * 128;
}

Gpt2Config gpt2_config(int n_layer, int n_head, int n_embd, int n_positions, int vocab_size) {
  Gpt2Config config;
  config.n_layer = n_layer;
  config.n_head = n_head;
  config.n_embd = n_embd;
  config.n_positions = n_positions;
  config.vocab_size = vocab_size;
  config.padded_vocab_size = pad_vocab_size(vocab_size);
  return config;
}

namespace {

struct NamedConfig {
  const char* name;
  int n_layer, n_head, n_embd, n_positions;
};

// The published GPT-2 sizes, plus "small": 4 layers of width 128 over a 256-token context, sized
// so that a 2-core CPU trains it visibly in about ten minutes (most of its 7M parameters are the
// token embedding, which the full GPT-2 vocabulary makes unavoidable).
constexpr NamedConfig kNamedConfigs[] = {
    {"small", 4, 4, 128, 256},           {"gpt2", 12, 12, 768, 1024},
    {"gpt2-medium", 24, 16, 1024, 1024}, {"gpt2-large", 36, 20, 1280, 1024},
    {"gpt2-xl", 48, 25, 1600, 1024},
};

}  // namespace

Gpt2Config named_config(std::string_view name) {
  for (const NamedConfig& named : kNamedConfigs) {
    if (name == named.name)
      return gpt2_config(named.n_layer, named.n_head, named.n_embd, named.n_positions);
  }
  std::string known;
  for (const NamedConfig& named : kNamedConfigs)
    known += std::string(known.empty() ? "" : ", ") + named.name;
  fail("unknown model config '", name, "'; known configs: ", known,
       " (or give --layers, --heads and --dim)");
}

std::vector<std::string> named_config_names() {
  std::vector<std::string> names;
  for (const NamedConfig& named : kNamedConfigs) names.emplace_back(named.name);
  return names;
}

void validate_config(const Gpt2Config& config) {
  LAYUP_CHECK(config.n_layer >= 1, "the model needs at least 1 layer (got ", config.n_layer, ")");
  LAYUP_CHECK(config.n_head >= 1, "the model needs at least 1 attention head (got ", config.n_head,
              ")");
  LAYUP_CHECK(config.n_embd >= 1, "the model width must be positive (got ", config.n_embd, ")");
  LAYUP_CHECK(config.n_embd % config.n_head == 0, "the model width ", config.n_embd,
              " is not divisible by the number of heads ", config.n_head);
  LAYUP_CHECK(config.n_positions >= 1, "the model context must be positive (got ",
              config.n_positions, ")");
  LAYUP_CHECK(config.vocab_size >= 1 && config.vocab_size <= 65536, "vocabulary size ",
              config.vocab_size, " is out of range 1..65536 (tokens are stored as uint16)");
  LAYUP_CHECK(config.padded_vocab_size >= config.vocab_size, "padded vocabulary ",
              config.padded_vocab_size, " is smaller than the vocabulary ", config.vocab_size);
}

long long parameter_count(const Gpt2Config& config) {
  const long long C = config.n_embd;
  const long long per_block = 12 * C * C + 13 * C;
  return config.vocab_size * C + config.n_positions * C + config.n_layer * per_block + 2 * C;
}

}  // namespace layup
