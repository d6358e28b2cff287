// `layup train` as its phases: resume, ranks, outputs, data, plan and build, the starting state,
// the run folder, the steps, the end. Each phase is a function of train_setup.h or of the
// TrainingLoop (training_loop.h); what one hands the next travels in their structs.
#include "train/trainer.h"

#include "train/prepared_run.h"
#include "train/stop_signals.h"
#include "train/train_setup.h"
#include "train/training_loop.h"

namespace layup {

TrainResult train(TrainOptions options) {
  // Installed first: a SIGINT or SIGTERM during the setup (loading a large model takes minutes)
  // is then seen before the run folder is made, instead of ending the process midway.
  const StopSignals stop_signals;
  make_paths_absolute(options);
  const ResumePoint resume = find_resume_point(options);
  choose_save_dtype(options);
  validate_train_options(options);
  const RunRanks ranks = join_ranks(options, resume);
  check_run_outputs(options, resume, ranks);

  // The run resolved and its memory plan checked against the budgets and this machine before
  // anything is allocated or any data read: a run that cannot fit stops here, saying what would.
  TrainingData data = find_training_data(options, ranks);
  const HfFolderExtras checkpoint_extras = read_checkpoint_extras(options, resume);
  check_checkpoints_fit(options, resume.step);
  PreparedRun run(train_run_request(options, data, resume, ranks), ranks.world.get(), ranks.out,
                  {options.trace_path}, [&](const PlannedRun& planned) {
                    check_checkpoints_fit(options, resume.step, &planned.plan);
                    options.device = planned.target.device;
                    options.dtype = planned.target.dtype;
                    read_training_data(data, options);
                  });
  const long long tokens_seen = load_training_state(options, resume, run, *data.sampler);

  refuse_if_stopped(resume);
  create_run_folder(options, resume, ranks);
  TrainingLoop loop(options, resume, ranks, run, data, tokens_seen, checkpoint_extras);
  loop.print_header();
  TrainResult result = loop.run();
  loop.finish(result);
  return result;
}

}  // namespace layup
