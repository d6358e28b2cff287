// The `layup` program's command line: every command on one CLI11 app, built the same way for
// main() and for the tests that feed it bad input.
#include "cli/commands.h"
#include "cli/flags.h"
#include "comm/communicator.h"
#include "train/run_info.h"

namespace layup {

void add_layup_commands(CLI::App& app) {
  // Set before the commands are added: each takes its parent's formatter when created.
  auto formatter = std::make_shared<LayupHelpFormatter>();
  formatter->column_width(44);
  app.formatter(formatter);
  app.set_version_flag("--version", "layup " + layup_version() + " (commit " + git_commit() + ", " +
                                        (built_with_mpi() ? "with" : "without") + " MPI)");
  app.require_subcommand(1);
  // A flag given twice takes its last value, so a command line can override a shared prefix;
  // every value given is still checked.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  add_train_command(app);
  add_sample_command(app);
  add_tokenize_command(app);
  add_bench_command(app);
  add_adamw_bench_command(app);
  add_disk_bench_command(app);
  add_memory_command(app);
  add_study_command(app);
  add_calibrate_command(app);
}

}  // namespace layup
