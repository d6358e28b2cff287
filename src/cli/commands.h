// The subcommands of the `layup` program. Each adds itself to the CLI11 app and runs when chosen.
#pragma once

#include <CLI/CLI.hpp>

namespace layup {

void add_train_command(CLI::App& app);
void add_sample_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_adamw_bench_command(CLI::App& app);

}  // namespace layup
