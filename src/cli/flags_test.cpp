// Every flag of every command fed the values users mistype: each is refused in one line that
// names the flag and echoes the value as typed, or has a meaning docs/cli.md states.
#include "cli/flags.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "cli/commands.h"
#include "core/error.h"
#include "memory/place_override.h"

namespace layup {
namespace {

TEST(FlagChecks, WholeNumbersAreReadWholeAndInRange) {
  const WholeRange positive = at_least(1);
  EXPECT_EQ(check_whole<int>("8", positive), "");
  EXPECT_EQ(check_whole<int>("0", positive), "must be an integer ≥ 1 (got '0')");
  EXPECT_EQ(check_whole<int>("", positive), "must be an integer ≥ 1 (got '')");
  EXPECT_EQ(check_whole<int>("8x", positive), "must be an integer ≥ 1 (got '8x')");
  EXPECT_EQ(check_whole<int>(" 8", positive), "must be an integer ≥ 1 (got ' 8')");
  EXPECT_EQ(check_whole<int>("2147483648", positive),
            "must be an integer ≥ 1 (got '2147483648', above the most this flag holds, "
            "2147483647)");
  EXPECT_EQ(check_whole<unsigned long>("-1", from_to(0, 10)), "must be 0 .. 10 (got '-1')");
  EXPECT_EQ(check_whole<unsigned long>("18446744073709551615",
                                       from_to(0, std::numeric_limits<uint64_t>::max())),
            "");
  WholeRange cores = from_to(1, 4);
  cores.note = "this process may run on 4 cores";
  EXPECT_EQ(check_whole<int>("5", cores),
            "must be 1 .. 4 (got '5', this process may run on 4 cores)");
}

TEST(FlagChecks, RealsAreFiniteAndCheckedAsTheTypeHoldsThem) {
  const RealRange below_one = real_between(0, false, 1, true, "[0, 1)");
  EXPECT_EQ(check_real<float>("0.95", below_one), "");
  EXPECT_EQ(check_real<float>("nan", positive_real()), "must be a finite number > 0 (got 'nan')");
  EXPECT_EQ(check_real<float>("inf", positive_real()), "must be a finite number > 0 (got 'inf')");
  EXPECT_EQ(check_real<double>("1e400", positive_real()),
            "must be a finite number > 0 (got '1e400')");
  EXPECT_EQ(check_real<float>("1e39", positive_real()),
            "must be a finite number > 0 (got '1e39', beyond the largest a 32-bit float holds)");
  // In range as typed, out of it once rounded to a float: the message says both.
  EXPECT_EQ(check_real<float>("0.9999999999", below_one),
            "must be [0, 1) (got '0.9999999999', which a 32-bit float holds as 1)");
  EXPECT_EQ(check_real<float>("1e-50", positive_real()),
            "must be a finite number > 0 (got '1e-50', which a 32-bit float holds as 0)");
  EXPECT_EQ(check_real<double>("1e-50", positive_real()), "");
  EXPECT_EQ(check_real<float>("", positive_real()), "must be a finite number > 0 (got '')");
  EXPECT_EQ(check_real<float>("0.1.2", positive_real()),
            "must be a finite number > 0 (got '0.1.2')");
}

TEST(FlagChecks, NamesAreNotEmptyAndNotFlags) {
  EXPECT_EQ(check_path("runs/a"), "");
  EXPECT_EQ(check_path("./-a"), "");
  EXPECT_EQ(check_path(""), "must not be empty (got '')");
  EXPECT_NE(check_path("--overwrite").find("./--overwrite"), std::string::npos);
}

TEST(FlagChecks, NearestNameIsSuggestedOnlyWhenNear) {
  const std::vector<std::string> flags = {"--layers", "--heads", "--lr", "--min-lr"};
  EXPECT_EQ(nearest_name("--layres", flags), "--layers");
  EXPECT_EQ(nearest_name("--min-l", flags), "--min-lr");
  EXPECT_EQ(nearest_name("--frobnicate", flags), "");
  EXPECT_EQ(nearest_name("trian", {"train", "bench", "sample"}), "train");
}

// The app as main() builds it, stopped once every flag is checked and before any command runs:
// the top-level app's parse-complete callback runs after the flags' checks and before the
// subcommands' own callbacks.
struct ParsedOnly {};
struct ParsedApp {
  CLI::App app{"layup"};
  ParsedApp() {
    add_layup_commands(app);
    app.parse_complete_callback([] { throw ParsedOnly(); });
  }
  // "" when the line parses; else the one line main() would print.
  std::string parse(std::vector<std::string> args) {
    std::vector<const char*> argv = {"layup"};
    for (const std::string& arg : args) argv.push_back(arg.c_str());
    const std::string unknown = unknown_subcommand(app, static_cast<int>(argv.size()), argv.data());
    if (!unknown.empty()) return unknown;
    try {
      app.parse(static_cast<int>(argv.size()), argv.data());
    } catch (const ParsedOnly&) {
      return "";
    } catch (const CLI::ParseError& error) {
      return describe_parse_error(app, error);
    } catch (const Error& error) {
      return error.what();
    }
    ADD_FAILURE() << "the command ran: the parse-only stop did not hold";
    return "";
  }
};

// What a command needs besides the flag under test to parse at all.
std::vector<std::string> required_args(const std::string& command) {
  if (command == "bench-disk") return {"--offload-dir", "scratch"};
  if (command == "sample") return {"--checkpoint", "run"};
  if (command == "tokenize") return {"corpus.txt", "--out", "shards"};
  return {};
}

// Flags whose value names a file or folder: every non-empty text not starting with '-' is such a
// name (docs/cli.md's value column says which), whatever it looks like.
bool names_a_path(const CLI::Option* option) {
  static const std::set<std::string> kinds = {"file",
                                              "folder",
                                              "directory",
                                              "folder or tokenizer.json",
                                              "folder or file",
                                              "model folder",
                                              "checkpoint or run folder",
                                              "name, model folder or config.json",
                                              "file ..."};
  return kinds.contains(option->get_type_name());
}

// The values of the table each flag is fed, and the ones a flag takes with a documented meaning:
// (command, flag, value) -> the words docs/cli.md's row for the flag says it with.
const std::vector<std::string> kBadValues = {"0",   "-1",  "",      "abc",
                                             "inf", "nan", "1e999", "99999999999999999999"};
const std::map<std::tuple<std::string, std::string, std::string>, std::string>& documented_zeros() {
  static const std::map<std::tuple<std::string, std::string, std::string>, std::string> table = {
      {{"train", "--streamed-blocks", "0"}, "(0: every block's weights on the device)"},
      {{"bench", "--streamed-blocks", "0"}, "(0: every block's weights on the device)"},
      {{"memory", "--streamed-blocks", "0"}, "(0: every block's weights on the device)"},
      {{"study", "--streamed-blocks", "0"}, "(0: every block's weights on the device)"},
      {{"train", "--eval-every", "0"}, "(0: never)"},
      {{"train", "--checkpoint-every", "0"}, "(0: only at the end)"},
      {{"train", "--sample-tokens", "0"}, "(0: no sample)"},
      {{"train", "--top-k", "0"}, "[sampling]"},
      {{"train", "--warmup", "0"}, "linear warmup"},
      {{"train", "--min-lr", "0"}, "learning rate at the end"},
      {{"train", "--weight-decay", "0"}, "decoupled weight decay"},
      {{"train", "--beta1", "0"}, "beta1"},
      {{"train", "--beta2", "0"}, "beta2"},
      {{"train", "--seed", "0"}, "[seed and threads]"},
      {{"train", "--recompute", "0"}, "[CUDA backend]"},
      {{"bench", "--warmup", "0"}, "untimed"},
      {{"bench", "--seed", "0"}, "[seed and threads]"},
      {{"bench", "--recompute", "0"}, "[CUDA backend]"},
      {{"memory", "--recompute", "0"}, "[CUDA backend]"},
      {{"study", "--warmup", "0"}, "untimed"},
      {{"study", "--seed", "0"}, "[seed and threads]"},
      {{"study", "--noise", "0"}, "beats the default"},
      {{"calibrate", "--recompute", "0"}, "--recompute"},
      {{"calibrate", "--cpu-seconds", "0"}, "at least"},
      {{"sample", "--top-k", "0"}, "[sampling]"},
      {{"sample", "--seed", "0"}, "seed"},
      {{"sample", "--prompt-ids", "0"}, "token ids"},
  };
  return table;
}

// docs/cli.md's table row for `flag` in the section of `command`: the row whose first cell
// names it.
std::string doc_row(const std::string& command, const std::string& flag) {
  std::ifstream file(std::string(LAYUP_DATA_DIR) + "/../docs/cli.md");
  std::stringstream text;
  text << file.rdbuf();
  const std::string doc = text.str();
  const size_t section = doc.find("## `layup " + command + "`");
  if (section == std::string::npos) return "";
  const size_t end = doc.find("\n## ", section + 1);
  std::istringstream lines(doc.substr(section, end - section));
  for (std::string line; std::getline(lines, line);) {
    const size_t first_cell_end = line.find('|', 1);
    if (line.starts_with("|") && first_cell_end != std::string::npos &&
        line.substr(0, first_cell_end).find("`" + flag + "`") != std::string::npos)
      return line;
  }
  return "";
}

TEST(FlagTable, EveryFlagOfEveryCommandRefusesOrMeansEachBadValue) {
  ParsedApp parsed;
  std::set<std::tuple<std::string, std::string, std::string>> accepted_zeros;
  int cases = 0;
  for (CLI::App* command : parsed.app.get_subcommands([](CLI::App*) { return true; })) {
    const std::string name = command->get_name();
    for (const CLI::Option* option : command->get_options()) {
      if (option->get_expected_min() == 0) continue;  // --help and on/off flags take no value
      const std::string flag = option->get_name();
      for (const std::string& value : kBadValues) {
        std::vector<std::string> args = {name};
        if (option->get_positional() && !option->nonpositional()) {
          args.push_back(value);
          args.insert(args.end(), {"--out", "shards"});
        } else {
          args.insert(args.end(), {flag, value});
          for (const std::string& arg : required_args(name)) args.push_back(arg);
        }
        const std::string message = parsed.parse(args);
        ++cases;
        SCOPED_TRACE("layup " + name + " " + flag + " '" + value + "'");
        if (message.empty()) {
          if (names_a_path(option)) {
            EXPECT_FALSE(value.empty() || value.front() == '-');
            continue;
          }
          if (option->get_type_name() == "text") continue;  // a prompt: any text, "" too
          // A flag without an upper bound, or whose bound is another flag's value (checked once
          // both are known), takes 1e20 as its range says.
          const std::string shown = option->get_type_name();
          if ((shown.starts_with("finite number") || shown.starts_with("number") ||
               shown.find("--") != std::string::npos) &&
              value == "99999999999999999999")
            continue;
          const auto meaning = documented_zeros().find({name, flag, value});
          if (meaning == documented_zeros().end()) {
            ADD_FAILURE() << "accepted, with no documented meaning in this test's table";
            continue;
          }
          const std::string row = doc_row(name, flag);
          EXPECT_NE(row.find(meaning->second), std::string::npos)
              << "docs/cli.md's row for " << flag << " does not say '" << meaning->second
              << "': " << row;
          accepted_zeros.insert(meaning->first);
          continue;
        }
        EXPECT_EQ(message.find('\n'), std::string::npos) << message;
        const std::string named = option->get_positional() ? "" : flag;
        EXPECT_NE(message.find(named), std::string::npos) << message;
        EXPECT_NE(message.find("'" + value + "'"), std::string::npos)
            << "the refusal does not echo the value as typed: " << message;
      }
    }
  }
  EXPECT_GT(cases, 500);
  // Each documented meaning is one the table met: a stale row would hide a refusal gone missing.
  for (const auto& [key, words] : documented_zeros())
    EXPECT_TRUE(accepted_zeros.contains(key))
        << std::get<0>(key) << " " << std::get<1>(key) << " " << std::get<2>(key)
        << " is now refused: drop it from documented_zeros()";
}

TEST(FlagTable, EveryValueGivenIsCheckedNotOnlyTheLast) {
  ParsedApp parsed;
  EXPECT_EQ(parsed.parse({"train", "--steps", "abc", "--steps", "2"}),
            "--steps must be an integer ≥ 1 (got 'abc')");
  EXPECT_EQ(parsed.parse({"train", "--steps", "3", "--steps", "2"}), "");
}

TEST(ParseErrors, AreOneLineWithTheNearestNameOrTheRange) {
  ParsedApp parsed;
  EXPECT_EQ(parsed.parse({"trian"}),
            "unknown command 'trian'; did you mean `layup train`? (the commands: train, sample, "
            "tokenize, bench, bench-adamw, bench-disk, memory, study, calibrate; `layup --help` "
            "says what each does)");
  EXPECT_EQ(parsed.parse({"train", "--layres", "2"}),
            "`layup train` has no flag --layres; did you mean --layers? (`layup train --help` "
            "lists its flags)");
  EXPECT_EQ(parsed.parse({"bench", "--frobnicate"}),
            "`layup bench` has no flag --frobnicate (`layup bench --help` lists its flags)");
  EXPECT_EQ(parsed.parse({"train", "--layers", "2147483648"}),
            "--layers must be an integer ≥ 1 (got '2147483648', above the most this flag holds, "
            "2147483647)");
  EXPECT_EQ(parsed.parse({"train", "--out", "--overwrite"}).substr(0, 33),
            "--out takes a name, and '--overwr");
  EXPECT_EQ(parsed.parse({"train", "--batch"}), "--batch needs a value after it: an integer ≥ 1");
  EXPECT_EQ(parsed.parse({"train", "--mode", "fast"}),
            "--mode takes one of gpu, offload, layup (got 'fast')");
  EXPECT_EQ(parsed.parse({"train", "2"}).substr(0, 40), "`layup train` takes no argument '2' here");
  EXPECT_NE(parsed.parse({}).find("give a command: train"), std::string::npos);
  EXPECT_EQ(parsed.parse({"--versoin"}),
            "`layup` has no flag --versoin; did you mean --version? (a command's flags go after "
            "the command: layup train --steps 100)");
  EXPECT_EQ(parsed.parse({"--steps", "2", "train"}).substr(0, 27), "`layup` has no flag --steps");
}

// --place is parsed where it enters, into the typed overrides a run takes: aliases and commas
// and repeats, in order; one bad value among them is refused with --place's own message.
TEST(MemoryFlags, PlaceIsParsedOnceIntoTypedOverrides) {
  struct Flags {
    CLI::App app{"layup"};
    std::optional<size_t> memory_budget, device_budget, host_budget;
    bool allow_overcommit = false;
    std::vector<PlaceOverride> place;
    std::string plan_path;
    Flags() {
      add_memory_flags(app, memory_budget, device_budget, host_budget, allow_overcommit, place,
                       plan_path);
    }
    std::string parse(std::vector<const char*> args) {
      args.insert(args.begin(), "layup");
      try {
        app.parse(static_cast<int>(args.size()), args.data());
        return "";
      } catch (const CLI::ParseError& error) {
        return describe_parse_error(app, error);
      }
    }
  };
  Flags given;
  EXPECT_EQ(
      given.parse({"--place", "grads=pinned,master-weights=mapped", "--place", "moments=host"}),
      "");
  EXPECT_EQ(given.place,
            (std::vector<PlaceOverride>{{TensorClass::kWeightGrads, MemoryKind::kPinnedMapped},
                                        {TensorClass::kMasterWeights, MemoryKind::kPinnedMapped},
                                        {TensorClass::kOptimizerMoments, MemoryKind::kHost}}));
  EXPECT_EQ(place_override_names(given.place),
            (std::vector<std::string>{"grads=pinned", "master=pinned", "moments=host"}));

  Flags none;
  EXPECT_EQ(none.parse({}), "");
  EXPECT_TRUE(none.place.empty());

  Flags bad;
  EXPECT_EQ(bad.parse({"--place", "grads=host,moments=vram"}),
            "--place moments=vram: 'vram' is not a memory kind; use device, pinned, managed, "
            "pageable or host");
  EXPECT_TRUE(bad.place.empty());
  EXPECT_EQ(Flags().parse({"--place", "grads"}),
            "--place takes CLASS=KIND, e.g. --place grads=pinned (got 'grads')");
}

}  // namespace
}  // namespace layup
