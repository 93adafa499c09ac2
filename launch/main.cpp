// The `moe` program: parses the command line (CLI11) and runs a subcommand. The only place that turns
// errors into exit codes: 0 success, 2 bad input (nothing written), 1 anything else (docs/cli.md).
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "core/backend/cpu/blas_kernels.h"
#include "core/error.h"
#include "core/host.h"
#include "launch/commands/ckpt_command.h"
#include "launch/commands/prep_command.h"
#include "launch/interop/export_hf.h"
#include "launch/interop/import_hf.h"
#include "launch/interop/logits_command.h"
#include "launch/supervise/job_processes.h"
#include "launch/supervise/supervisor.h"
#include "launch/sweep/report.h"
#include "launch/sweep/sweep.h"
#include "launch/train/trainer.h"
#include "parallel/mpi_communicator.h"

namespace {

constexpr int kExitBadInput = 2;
constexpr int kExitOther = 1;

// `moe train`'s options.
CLI::App* add_train_command(CLI::App& app, moe::TrainOptions& train) {
  CLI::App* train_cmd = app.add_subcommand(
      "train", "One rank of training (run it under mpirun for several ranks; without mpirun for one).");
  train_cmd->add_option("--config", train.config_path, "Experiment config (JSON); see docs/config.md")
      ->required()
      ->check(CLI::ExistingFile);
  train_cmd->add_option("--set", train.overrides,
                        "Override a config key: --set moe.router.tau=0.5 (repeatable; value parsed as JSON, "
                        "else taken as a string)");
  train_cmd->add_option("--run-dir", train.run_dir,
                        "Run directory for config.json, manifest.json, metrics.jsonl (default: runs/<config name>)");
  train_cmd
      ->add_option("--resume", train.resume,
                   "auto: continue from the newest checkpoint of the run directory that verifies, if any; "
                   "none: start from step 0; PATH: a checkpoint")
      ->default_val("auto");
  train_cmd->add_flag("--overwrite", train.overwrite,
                      "Start again in a run directory that already holds a run (its files are replaced)");
  train_cmd
      ->add_option("--allow-config-change", train.allow_config_change,
                   "Resume even though these keys (or prefixes, e.g. data) differ from the checkpoint's config: "
                   "KEY,KEY,... (see docs/cli.md)")
      ->delimiter(',');
  train_cmd->add_flag("--allow-data-change", train.allow_data_change,
                      "Resume even though the training data (its provenance hash: text, prepared manifest, tokenizer) "
                      "differs from the checkpoint's");
  train_cmd->add_flag("--quiet", train.quiet, "No progress line on the terminal");
  train_cmd
      ->add_option("--stop-after-step", train.stop_after_step,
                   "End after this step (and its checkpoint) as if interrupted; for resume tests and demos")
      ->check(CLI::PositiveNumber);

  return train_cmd;
}

// `moe launch`'s options.
CLI::App* add_launch_command(CLI::App& app, moe::LaunchOptions& launch) {
  CLI::App* launch_cmd = app.add_subcommand(
      "launch",
      "The supervisor: runs mpirun for you, watches every rank's heartbeat, and restarts the job from "
      "the newest checkpoint that verifies after a crash or a hang (fault.* config keys).");
  launch_cmd->add_option("--np", launch.np, "Ranks to run (a whole number >= 1)")
      ->required()
      ->check(CLI::Validator(
          [](std::string& text) {
            char* end = nullptr;
            errno = 0;
            const long long n = std::strtoll(text.c_str(), &end, 10);
            if (text.empty() || *end != '\0' || errno != 0 || n < 1)
              return "expected a whole number of ranks >= 1, got " + text;
            return std::string();
          },
          "N>=1"));
  launch_cmd->add_option("--hostfile", launch.hostfile, "OpenMPI hostfile (host slots=N per line)")
      ->check(CLI::ExistingFile);
  launch_cmd->add_option("--mpirun", launch.mpirun, "The mpirun program")->default_val("mpirun");
  launch_cmd->add_option("--mpirun-arg", launch.mpirun_args,
                         "An extra argument for mpirun (repeatable), e.g. --mpirun-arg=--oversubscribe");
  launch_cmd->add_option("--config", launch.config_path, "Experiment config (JSON)")
      ->required()
      ->check(CLI::ExistingFile);
  launch_cmd->add_option("--set", launch.overrides, "Override a config key (repeatable), as for moe train");
  launch_cmd->add_option("--run-dir", launch.run_dir,
                         "Run directory (default: runs/<config name>); events.log goes there");
  launch_cmd->add_option("--resume", launch.resume, "First start: auto, none or PATH (restarts always resume auto)")
      ->default_val("auto");
  launch_cmd->add_flag("--overwrite", launch.overwrite, "First start: replace a run directory that holds a run");
  launch_cmd
      ->add_option("--allow-config-change", launch.allow_config_change,
                   "As for moe train: keys whose change since the checkpoint is meant (KEY,KEY,...)")
      ->delimiter(',');
  launch_cmd->add_flag("--allow-data-change", launch.allow_data_change,
                       "As for moe train: resume although the training data changed");
  launch_cmd->add_flag("--quiet", launch.quiet, "No progress lines from the ranks and no event echo");
  launch_cmd
      ->add_option(
          "--term-grace-s", launch.term_grace_s,
          "On SIGTERM/SIGINT: seconds the ranks have, after SIGUSR1 (a clean stop), to end by themselves before every "
          "process of the job is killed (a second signal kills at once)")
      ->default_val(30)
      ->check(CLI::Range(0.0, 86400.0));

  return launch_cmd;
}

// The exit code of an error that reached the program (docs/cli.md), after saying what it was.
int report(const moe::Error& e, int rank, int size) {
  if (e.kind() == moe::ErrorKind::BadInput) {
    // Bad input is found identically on every rank (or agreed from rank 0): one message, every rank exits 2.
    if (rank == 0) std::fprintf(stderr, "moe: error: %s\n", e.message().c_str());
    return kExitBadInput;
  }
  if (e.kind() == moe::ErrorKind::RunFailed) {
    std::fprintf(stderr, "moe: stopped (%s): %s\n", moe::error_context().c_str(), e.message().c_str());
    return kExitOther;
  }
  std::fprintf(stderr, "moe: internal error (%s, %s:%d): %s\n", moe::error_context().c_str(), e.file().c_str(),
               e.line(), e.message().c_str());
  if (size > 1) moe::MpiCommunicator::abort(kExitOther);  // the other ranks may wait in a collective
  return kExitOther;
}

// The overview under `moe --help`.
constexpr const char* kFooter =
    "Train:  moe train --config FILE [--set KEY=VALUE]... [--run-dir DIR] [--resume auto|none|PATH]\n"
    "Launch: moe launch --np N [--hostfile F] --config FILE [--set KEY=VALUE]... (restarts after faults)\n"
    "Ckpt:   moe ckpt ls|verify|info PATH, moe ckpt export PATH --out FILE.h5 [--all] [--force]\n"
    "Prep:   moe prep --input [NAME=]PATH... --out DIR [--tokenizer train|byte|FILE] [--vocab N]\n"
    "Sweep:  moe sweep --config BASE --grid KEY=V1,V2,... [--grid ...] [--seeds N] [--np N] --out DIR\n"
    "Report: moe report RUN_DIR|SWEEP_DIR [--out FILE.html]\n"
    "Logits: moe logits PATH --tokens IDS|--text TEXT [--generate N] [--out FILE.json]\n"
    "Export: moe export hf PATH --out DIR [--dtype fp32|bf16] [--overwrite] (a transformers model directory)\n"
    "Import: moe import hf DIR --config FILE --out RUN_DIR (a transformers model as a checkpoint)\n"
    "Docs:   docs/cli.md (commands), docs/config.md (config keys), docs/metrics.md (metrics.jsonl),\n"
    "        docs/checkpoint.md (checkpoint layout)";

// The job's communicator when mpirun started this process (null alone), and this rank's place in it; false, said
// on stderr, when MPI cannot start.
bool start_world(int* argc, char*** argv, std::unique_ptr<moe::Communicator>* world, int* rank, int* size) {
  try {
    if (!moe::MpiCommunicator::launched_by_mpirun()) return true;
    moe::MpiCommunicator::initialize(argc, argv);
    auto mpi = moe::MpiCommunicator::world();
    *rank = mpi->rank(), *size = mpi->size();
    *world = std::move(mpi);
    return true;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe: cannot start MPI: %s\n", e.what());
    return false;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const pid_t parent_at_start = ::getppid();
  // A rank started by moe launch (its heartbeat secret in the environment) dies with the mpirun that started
  // it: a supervisor killed with SIGKILL takes mpirun with it, and mpirun its ranks (launch/supervise/job_processes.h).
  if (argc > 1 && std::string(argv[1]) == "train" && std::getenv("MOE_HEARTBEAT_SECRET"))
    moe::die_with_parent(SIGKILL, parent_at_start);
  // First: where OpenBLAS did not recognise this CPU, this executes the program again with the kernels the CPU
  // has (core/backend/cpu/blas_kernels.h).
  moe::cpu::choose_blas_kernels(argv);
  CLI::App app{
      "moe: train mixture-of-experts language models, from one laptop to a GPU cluster.\n"
      "Run `moe SUBCOMMAND --help` for the options of each subcommand.",
      "moe"};
  app.require_subcommand(1);
  app.footer(kFooter);

  moe::TrainOptions train;
  CLI::App* train_cmd = add_train_command(app, train);
  moe::CkptOptions ckpt;
  CLI::App* ckpt_cmd = moe::add_ckpt_command(app, ckpt);

  moe::LaunchOptions launch;
  CLI::App* launch_cmd = add_launch_command(app, launch);
  moe::PrepOptions prep;
  CLI::App* prep_cmd = moe::add_prep_command(app, prep);
  moe::SweepOptions sweep;
  CLI::App* sweep_cmd = moe::add_sweep_command(app, sweep);
  moe::ReportOptions report_options;
  CLI::App* report_cmd = moe::add_report_command(app, report_options);
  moe::LogitsOptions logits;
  CLI::App* logits_cmd = moe::add_logits_command(app, logits);
  moe::ExportHfOptions export_hf;
  CLI::App* export_hf_cmd = moe::add_export_command(app, export_hf);
  moe::ImportHfOptions import_hf;
  CLI::App* import_hf_cmd = moe::add_import_command(app, import_hf);

  // CLI11 reports a missing subcommand before an unknown one; name the unknown word instead.
  if (argc > 1 && argv[1][0] != '-' &&
      app.get_subcommands([&](CLI::App* sub) { return sub->get_name() == argv[1]; }).empty()) {
    std::fprintf(stderr,
                 "moe: error: unknown subcommand '%s'; the subcommands are: train, launch, ckpt, prep, sweep, report, "
                 "logits, export, import (see moe --help)\n",
                 argv[1]);
    return kExitBadInput;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : kExitBadInput;
  }

  // Under mpirun every rank runs this program; alone it runs without MPI.
  std::unique_ptr<moe::Communicator> world;
  int rank = 0, size = 1;
  if (!start_world(&argc, &argv, &world, &rank, &size)) return kExitOther;
  moe::set_error_context(rank, moe::host_name());
  try {
    if (train_cmd->parsed()) {
      train.command_line.assign(argv, argv + argc);
      // The one backend of this process (train.device): everything that allocates or computes is handed it.
      const moe::TrainResult result = moe::run_train(train, std::move(world));
      if (result.stop_signal != 0) return 128 + result.stop_signal;
    } else if (ckpt_cmd->parsed()) {
      moe::run_ckpt(ckpt, std::cout);
    } else if (prep_cmd->parsed()) {
      moe::run_prep_command(prep);
    } else if (import_hf_cmd->parsed()) {
      moe::run_import_hf(import_hf, std::cout);
    } else if (export_hf_cmd->parsed()) {
      moe::run_export_hf(export_hf, std::cout);
    } else if (logits_cmd->parsed()) {
      moe::run_logits(logits, std::cerr);
    } else if (report_cmd->parsed()) {
      moe::run_report(report_options);
    } else if (sweep_cmd->parsed()) {
      return moe::run_sweep(sweep);
    } else if (launch_cmd->parsed()) {
      launch.command_line.assign(argv, argv + argc);
      return moe::run_launch(launch);
    }
    return 0;
  } catch (const moe::Error& e) {
    return report(e, rank, size);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe: error (%s): %s\n", moe::error_context().c_str(), e.what());
    if (size > 1) moe::MpiCommunicator::abort(kExitOther);
    return kExitOther;
  }
}
