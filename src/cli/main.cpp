// layup: train GPT-2 and Llama-family models. `layup --help` lists the commands.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <new>
#include <system_error>

#include "cli/commands.h"
#include "cli/environment.h"
#include "cli/flags.h"
#include "comm/communicator.h"
#include "core/error.h"

namespace {

int report(const std::string& message) {
  std::fprintf(stderr, "\nlayup: error: %s\n", message.c_str());
  std::fflush(stderr);
  layup::abort_other_ranks(1);  // where mpirun started several ranks, none is left waiting
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  // Past a file size limit (ulimit -f) a write then fails with EFBIG and the writer's own message
  // names the file, instead of the process dying by SIGXFSZ with a half-written file left.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{
      "layup trains GPT-2 and Llama-family language models, with a layer-wise split between GPU "
      "and CPU.\n"
      "Run `layup train` with no arguments to train a small GPT-2 on the shipped corpus."};
  layup::add_layup_commands(app);
  // Once the command line has parsed (--help needs no environment), before the command runs.
  app.parse_complete_callback([] {
    layup::apply_layup_environment(
        layup::read_layup_environment([](const char* name) { return std::getenv(name); }));
  });
  // Every failure ends here as one message and exit status 1 (--help and --version exit 0).
  try {
    const std::string unknown = layup::unknown_subcommand(app, argc, argv);
    if (!unknown.empty()) return report(unknown);
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == 0) return app.exit(error);  // --help, --version
    return report(layup::describe_parse_error(app, error));
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
