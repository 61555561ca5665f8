#pragma once
// The library's messages name the option a user sets, as the member of its options struct in backticks
// ("`device` cuda: no CUDA GPU is visible on this machine; use `device` cpu"): a library user never typed a flag.
// The `tandem` program's users set flags, so main.cpp passes every error line through with_flag_names(), which
// writes each of those names as the flag that sets it ("--device cuda: ... use --device cpu").
//
// Every backticked name in a string literal under src/ and include/ must be in option_names()
// (tests/apps/option_names_test.cpp scans for them), so a new library message cannot name a field the program
// cannot map back.
#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

namespace tandem::app {

struct OptionName {
  const char* field;  // the options struct's member, as library messages name it
  // The flag that sets it; empty: the program has no flag for it, and the message keeps the field's name.
  const char* flag;
  // The flag turns the field off (--no-shuffle sets `shuffle` false): messages write "`shuffle` off", which
  // becomes the flag alone.
  bool flag_turns_off = false;
};

inline const std::vector<OptionName>& option_names() {
  static const std::vector<OptionName> names = {
      // comm::InitOptions, and the loop's device
      {"device", "--device"},
      {"backend", "--backend"},
      {"timeout", "--timeout"},
      {"init_method", ""},  // tandem train rendezvouses through MASTER_ADDR/MASTER_PORT only
      // data::DataFolderOptions
      {"dir", "--data"},
      {"normalization", "--normalize"},
      {"num_classes", "--num-classes"},
      {"image_size", "--image-size"},
      {"val_split", "--val-split"},
      {"min_crop_scale", "--min-crop-scale"},
      {"skip_bad_images", "--skip-bad-images"},
      // train::LoopOptions
      {"epochs", "--epochs"},
      {"batch_size", "--batch-size"},
      {"max_steps", "--steps"},
      {"seed", "--seed"},
      {"shuffle", "--no-shuffle", true},
      {"accumulate_batches", "--accumulate-batches"},
      {"comm_hook", "--comm-hook"},
      {"uneven_inputs", "--uneven"},
      {"lrf", "--lrf"},
      {"warmup_steps", ""},  // the program keeps the default
      {"loss", ""},          // the program keeps cross-entropy
      {"run_dir", "--run-dir"},
      {"resume", "--resume"},
      {"checkpoint_every", "--checkpoint-every"},
      {"keep_checkpoints", "--keep-checkpoints"},
      {"checkpoint_format", "--checkpoint-format"},
      {"check_replicas_every", "--check-replicas-every"},
      {"precision", "--precision"},
      {"strategy", "--strategy"},
      {"reshard_after_forward", "--reshard-after-forward"},
      {"dp_devices", "--dp-replicas"},
      {"tensorboard", "--no-tensorboard", true},
      {"report", "--no-report", true},
      {"timeline_path", "--timeline"},
      // Set from `tandem run --recovery in-job` (TANDEM_RECOVERY), which has the flag.
      {"in_job_recovery", "--recovery in-job"},
      {"recovery", "--recovery"},
      {"timeline_steps", "--timeline-steps"},
      // TrainingProgramOptions (apps/program/training_program.h)
      {"model", "--model"},
      {"sync_bn", "--sync-bn"},
      {"init_weights", "--init"},
      {"strict", "--strict"},
      {"freeze_layers", "--freeze-layers"},
      {"save_weights", "--save-weights"},
      {"lr", "--lr"},
      {"momentum", "--momentum"},
      {"weight_decay", "--weight-decay"},
      {"optimizer", "--optimizer"},
      {"betas", "--betas"},
      {"eps", "--eps"},
      {"init_optimizer", "--init-optimizer"},
      {"zero", "--zero"},
      // Hyper-parameters of PyTorch's optimizers that tandem train keeps at LibTorch's defaults
      // (checkpoint/optimizer_import.h names them).
      {"dampening", ""},
      {"nesterov", ""},
      {"amsgrad", ""},
      {"alpha", ""},
      {"centered", ""},
      // launch::LaunchOptions (`tandem run`)
      {"nproc_per_node", "--nproc-per-node"},
      {"nnodes", "--nnodes"},
      {"node_rank", "--node-rank"},
      {"master_addr", "--master-addr"},
      {"master_port", "--master-port"},
      {"log_dir", "--log-dir"},
      {"gpus", "--gpus"},
      {"grace_period", "--grace-period"},
      {"max_restarts", "--max-restarts"},
      {"run_id", "--run-id"},
      {"rdzv_backend", "--rdzv-backend"},
      {"rdzv_endpoint", "--rdzv-endpoint"},
      {"rdzv_conf", "--rdzv-conf"},
  };
  return names;
}

inline const OptionName* find_option_name(const std::string& field) {
  const auto& names = option_names();
  const auto found = std::find_if(names.begin(), names.end(), [&](const OptionName& n) { return field == n.field; });
  return found == names.end() ? nullptr : &*found;
}

// A backticked option name as library messages write it: lower case letters, digits and '_', starting with a
// letter. Other backticked text (`tandem run`, `--`) is not a name and stays as it is.
inline bool is_option_name(const std::string& text) {
  if (text.empty() || !std::islower(static_cast<unsigned char>(text.front()))) return false;
  return std::all_of(text.begin(), text.end(), [](unsigned char c) {
    return std::islower(c) || std::isdigit(c) || c == '_';
  });
}

// `message` with each backticked option name written as its flag ("`device` cpu" -> "--device cpu", "`shuffle`
// off" -> "--no-shuffle"); a name the table has no flag for loses only its backticks.
inline std::string with_flag_names(const std::string& message) {
  static const std::string kOff = " off";
  std::string out;
  size_t at = 0;
  while (at < message.size()) {
    const size_t open = message.find('`', at);
    const size_t close = open == std::string::npos ? std::string::npos : message.find('`', open + 1);
    if (close == std::string::npos) break;
    const std::string name = message.substr(open + 1, close - open - 1);
    if (!is_option_name(name)) {
      out.append(message, at, close + 1 - at);
      at = close + 1;
      continue;
    }
    out.append(message, at, open - at);
    at = close + 1;
    const OptionName* option = find_option_name(name);
    if (!option || !*option->flag) {
      out += name;
    } else if (!option->flag_turns_off) {
      out += option->flag;
    } else if (message.compare(at, kOff.size(), kOff) == 0) {
      out += option->flag;
      at += kOff.size();
    } else {
      out += name;  // on: no flag says that
    }
  }
  out.append(message, at, std::string::npos);
  return out;
}

}  // namespace tandem::app
