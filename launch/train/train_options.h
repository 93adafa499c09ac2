// What `moe train` is told on its command line (or by a test): the config, overrides, the run directory and
// how to resume. Apart from trainer.h so that the setup and resume headers need not include the trainer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moe {

struct TrainOptions {
  std::string config_path;
  std::vector<std::string> overrides;  // --set KEY=VALUE
  std::string run_dir;                 // empty: runs/<config file stem>
  std::string resume = "auto";         // auto | none | PATH
  bool overwrite = false;
  // Keys (or prefixes such as "data") whose change since the checkpoint is meant (launch/train/config_change.h).
  std::vector<std::string> allow_config_change;
  bool allow_data_change = false;         // resume although the data's provenance hash changed
  bool quiet = false;                     // no progress line (tests)
  bool collect_parameters = false;        // return the final parameters in global coordinates (tests)
  int64_t stop_after_step = 0;            // > 0: end after this step and its checkpoint, as if interrupted
  std::vector<std::string> command_line;  // recorded in manifest.json
};

}  // namespace moe
