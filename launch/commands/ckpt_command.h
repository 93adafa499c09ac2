// `moe ckpt`: look at checkpoints from the outside. `ls` lists the checkpoints of a run (newest first, with
// whether each verifies), `verify` checks one checkpoint and its chain down to every HDF5 chunk, `info`
// summarises its manifest, `export` writes one consolidated HDF5 file of full tensors. Never modifies a
// checkpoint; export writes only its --out file. Does not need MPI. docs/checkpoint.md, docs/cli.md.
#pragma once

#include <ostream>
#include <string>

namespace CLI {
class App;
}

namespace moe {

enum class CkptAction { None, Ls, Verify, Info, Export };

struct CkptOptions {
  CkptAction action = CkptAction::None;
  std::string path;    // a run directory, a checkpoint root, or one checkpoint directory
  std::string out;     // export: the HDF5 file to write
  bool all = false;    // export: optimizer, MoE and clipping state too, not only params/
  bool force = false;  // export: replace an existing --out
};

// Adds `ckpt` and its four subcommands to `app`; parsing fills `options`. Returns the `ckpt` subcommand.
CLI::App* add_ckpt_command(CLI::App& app, CkptOptions& options);

// Runs the parsed action, printing to `out`. Throws moe::Error: BadInput (exit 2) for a path that is not a
// checkpoint, a checkpoint that does not verify, or an --out that exists; nothing is written then.
void run_ckpt(const CkptOptions& options, std::ostream& out);

// The checkpoint directory PATH means, as the subcommands above take it: a checkpoint directory itself, or the
// newest checkpoint of a run directory or checkpoint root (said on `out`). BadInput when there is none.
std::string checkpoint_of_path(const std::string& path, std::ostream& out);

}  // namespace moe
