// layup: train GPT-2-family models. `layup --help` lists the commands.
#include <cstdio>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{
      "layup trains GPT-2-family language models, with a layer-wise split between GPU and CPU.\n"
      "Run `layup train` with no arguments to train a small GPT-2 on the shipped corpus."};
  app.require_subcommand(1);
  // A flag given twice takes its last value, so a command line can override a shared prefix.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  layup::add_train_command(app);
  layup::add_sample_command(app);
  layup::add_tokenize_command(app);
  layup::add_bench_command(app);
  layup::add_adamw_bench_command(app);
  layup::add_memory_command(app);
  layup::add_study_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  } catch (const layup::Error& error) {
    std::fprintf(stderr, "\nlayup: error: %s\n", error.what());
    return 1;
  }
  return 0;
}
