// layup: train GPT-2 and Llama-family models. `layup --help` lists the commands.
#include <cstdio>
#include <filesystem>
#include <new>
#include <system_error>

#include "cli/commands.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "train/run_info.h"

namespace {

int report(const std::string& message) {
  std::fprintf(stderr, "\nlayup: error: %s\n", message.c_str());
  std::fflush(stderr);
  layup::abort_other_ranks(1);  // where mpirun started several ranks, none is left waiting
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "layup trains GPT-2 and Llama-family language models, with a layer-wise split between GPU "
      "and CPU.\n"
      "Run `layup train` with no arguments to train a small GPT-2 on the shipped corpus."};
  app.set_version_flag("--version", "layup " + layup::layup_version() + " (commit " +
                                        layup::git_commit() + ", " +
                                        (layup::built_with_mpi() ? "with" : "without") + " MPI)");
  app.require_subcommand(1);
  // A flag given twice takes its last value, so a command line can override a shared prefix.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  layup::add_train_command(app);
  layup::add_sample_command(app);
  layup::add_tokenize_command(app);
  layup::add_bench_command(app);
  layup::add_adamw_bench_command(app);
  layup::add_disk_bench_command(app);
  layup::add_memory_command(app);
  layup::add_study_command(app);
  layup::add_calibrate_command(app);
  // Every failure ends here as one message and exit status 1 (--help and --version exit 0).
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : 1;
  } catch (const layup::Error& error) {
    return report(error.what());
  } catch (const std::filesystem::filesystem_error& error) {
    return report(error.code().message() + ": " + error.path1().string() +
                  (error.path2().empty() ? "" : " -> " + error.path2().string()) +
                  " (check that the path exists and that you may write there)");
  } catch (const std::bad_alloc&) {
    return report(
        "out of memory: an allocation failed although the memory plan fitted; something else "
        "on this machine may be using memory. Try a smaller --batch or --seq-len, or see what "
        "the run needs with `layup memory`");
  } catch (const std::system_error& error) {
    return report(std::string(error.what()) +
                  " (a thread could not start, or a system call failed: fewer --cpu-workers or "
                  "--threads may help, or a higher limit on processes: ulimit -u)");
  } catch (const std::exception& error) {
    return report(std::string("unexpected failure: ") + error.what() +
                  " (this is a bug in layup: please report it with the command line)");
  }
  layup::finish_ranks();
  return 0;
}
