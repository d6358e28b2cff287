// The model flags that `train`, `bench`, `memory` and `study` share (cli/commands.h): each
// command takes them, and they resolve into a config with the same checks everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "io/test_files.h"

namespace layup {
namespace {

using test_files::contains;
using test_files::error_message;

// Parses `arguments` as the flags of a command that takes the model flags.
struct ParsedModelFlags {
  CLI::App app;
  ModelFlags flags;

  explicit ParsedModelFlags(std::vector<std::string> arguments) {
    CLI::App* command = app.add_subcommand("command");
    add_model_flags(*command, flags, "gpt2");
    arguments.insert(arguments.begin(), "command");
    std::reverse(arguments.begin(), arguments.end());  // CLI11 takes a vector in reverse order
    app.parse(arguments);
  }
};

TEST(ModelFlags, EveryCommandThatBuildsAModelTakesThem) {
  CLI::App app;
  add_train_command(app);
  add_bench_command(app);
  add_memory_command(app);
  add_study_command(app);
  for (const char* command : {"train", "bench", "memory", "study"})
    for (const char* flag : {"--model", "--layers", "--heads", "--dim", "--context"})
      EXPECT_NO_THROW(app.get_subcommand(command)->get_option(flag)) << command << " " << flag;
}

TEST(ModelFlags, ExplicitSizesAndContext) {
  const ParsedModelFlags parsed(
      {"--layers", "2", "--heads", "2", "--dim", "64", "--context", "64"});
  const ModelConfig config = parsed.flags.resolve(64);
  EXPECT_EQ(config.n_layer, 2);
  EXPECT_EQ(config.n_head, 2);
  EXPECT_EQ(config.n_embd, 64);
  EXPECT_EQ(config.n_positions, 64);
  EXPECT_EQ(parsed.flags.name(), "custom");
  EXPECT_TRUE(parsed.flags.any_given());
}

TEST(ModelFlags, NamedConfigByDefaultWithItsContextReplaced) {
  const ParsedModelFlags defaults({});
  EXPECT_EQ(defaults.flags.resolve(1024).n_layer, named_config("gpt2").n_layer);
  EXPECT_EQ(defaults.flags.name(), "gpt2");
  EXPECT_FALSE(defaults.flags.any_given());
  const ParsedModelFlags longer({"--model", "small", "--context", "512"});
  EXPECT_EQ(longer.flags.resolve(512).n_positions, 512);
  EXPECT_EQ(longer.flags.resolve(512).n_embd, named_config("small").n_embd);
  EXPECT_EQ(longer.flags.name(), "small");
}

TEST(ModelFlags, NamedLlamaConfigsTakeTheContextAsked) {
  const ParsedModelFlags named({"--model", "llama-3.2-1b"});
  const ModelConfig config = named.flags.resolve(2048);
  EXPECT_TRUE(config.is_llama());
  EXPECT_EQ(parameter_count(config), 1235814400);
  EXPECT_EQ(config.n_positions, 131072);
  EXPECT_EQ(named.flags.name(), "llama-3.2-1b");
  const ParsedModelFlags shorter({"--model", "llama-3-8b", "--context", "4096"});
  EXPECT_EQ(shorter.flags.resolve(4096).n_positions, 4096);
  EXPECT_TRUE(contains(error_message([&] { shorter.flags.resolve(8192); }),
                       "--seq-len 8192 is above the model's context of 4096 positions"));
}

// --model takes a Hugging Face model folder or its config.json: the shape that file describes.
TEST(ModelFlags, ModelFolderOrConfigJson) {
  const test_files::TempDir dir;
  test_files::write_text(dir.file("config.json"), R"({
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
    "vocab_size": 300, "tie_word_embeddings": true})");
  for (const std::string& path : {dir.path(), dir.file("config.json")}) {
    const ParsedModelFlags parsed({"--model", path});
    const ModelConfig config = parsed.flags.resolve(64);
    EXPECT_TRUE(config.is_llama()) << path;
    EXPECT_EQ(config.n_layer, 2);
    EXPECT_EQ(config.kv_heads(), 2);
    EXPECT_EQ(config.mlp_width(), 96);
    EXPECT_EQ(config.n_positions, 128);
    EXPECT_TRUE(config.tie_word_embeddings);
    EXPECT_EQ(parsed.flags.name(), path);
    const ParsedModelFlags longer({"--model", path, "--context", "256"});
    EXPECT_EQ(longer.flags.resolve(256).n_positions, 256);
  }
  const ParsedModelFlags too_long({"--model", dir.path()});
  EXPECT_TRUE(contains(error_message([&] { too_long.flags.resolve(512); }),
                       "--seq-len 512 is above the model's context of 128 positions"));
}

TEST(ModelFlags, BadModelPathsAreRefusedNamingThePath) {
  const test_files::TempDir dir;
  std::filesystem::create_directory(dir.file("empty"));
  test_files::write_text(dir.file("broken.json"), "{\"model_type\": ");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {dir.file("missing"), dir.file("missing") + ": no such file or folder"},
      {"missing.json", "--model missing.json: no such file or folder"},
      {dir.file("empty"), dir.file("empty") + " is a folder without a config.json"},
      {dir.file("broken.json"), dir.file("broken.json") + " is not valid JSON"},
  };
  for (const auto& [path, message] : cases) {
    const ParsedModelFlags parsed({"--model", path});
    EXPECT_TRUE(contains(error_message([&] { parsed.flags.resolve(64); }), message));
  }
}

TEST(ModelFlags, RefusalsNameTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--model", "gpt2", "--layers", "2"}, "give either --model or --layers/--heads/--dim"},
      {{"--layers", "2", "--heads", "2"}, "an explicit model needs all of --layers, --heads and "},
      {{"--context", "64"}, "--seq-len 128 is above the model's context of 64 positions"},
      {{"--model", "nonsense"}, "unknown model config 'nonsense'"},
  };
  for (const auto& [arguments, message] : cases) {
    const ParsedModelFlags parsed(arguments);
    EXPECT_TRUE(contains(error_message([&] { parsed.flags.resolve(128); }), message));
  }
  // A size out of range is refused as it is parsed, naming the flag and the value as typed.
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {{"--layers", "0", "--heads", "2", "--dim", "32"},
       "--layers: must be an integer ≥ 1 (got '0')"},
      {{"--layers", "2", "--heads", "-1", "--dim", "32"},
       "--heads: must be an integer ≥ 1 (got '-1')"},
      {{"--context", "0"}, "--context: must be an integer ≥ --seq-len (got '0')"},
  };
  for (const auto& [arguments, message] : refused) {
    try {
      const ParsedModelFlags parsed(arguments);
      ADD_FAILURE() << message << ": accepted";
    } catch (const CLI::ValidationError& error) {
      EXPECT_EQ(std::string(error.what()), message);
    }
  }
}

}  // namespace
}  // namespace layup
