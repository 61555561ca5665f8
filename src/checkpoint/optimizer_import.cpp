// A PyTorch optimizer's state into LibTorch's (tandem/checkpoint/optimizer_import.h). Everything is checked first,
// then the states are set, so that a refusal leaves the optimizer as it was.
#include "tandem/checkpoint/optimizer_import.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>

#include "tandem/optim/optimizer_state_fields.h"
#include "tandem/util/compat.h"
#include "tandem/util/error.h"

namespace tandem::checkpoint {
namespace {

constexpr const char* kGroup = "optimizer.param_groups.0.";

// One hyper-parameter of the run, as PyTorch's param group spells it and renders it ("0.9", "[0.9, 0.999]",
// "false").
struct Setting {
  std::string key;
  std::string value;
};

std::string number(double value) { return fmt::format("{}", value); }
std::string flag(bool value) { return value ? "true" : "false"; }

// The run's optimizer: PyTorch's class name, the state fields its every parameter has, and its settings.
struct RunOptimizer {
  std::string name;
  std::vector<std::string> fields;
  std::vector<Setting> settings;
  bool has_step = false;
};

RunOptimizer describe(torch::optim::Optimizer& optimizer) {
  const torch::optim::OptimizerOptions& options = optimizer.param_groups().front().options();
  // Adam and AdamW keep the same state and settings; AdamW decays the weights apart from the gradient.
  const auto adam = [](const char* name, const auto& o) {
    return RunOptimizer{name, {"exp_avg", "exp_avg_sq"},
                        {{"betas", fmt::format("[{}, {}]", std::get<0>(o.betas()), std::get<1>(o.betas()))},
                         {"eps", number(o.eps())}, {"weight_decay", number(o.weight_decay())},
                         {"amsgrad", flag(o.amsgrad())}},
                        true};
  };
  if (const auto* o = dynamic_cast<const torch::optim::AdamWOptions*>(&options)) return adam("AdamW", *o);
  if (const auto* o = dynamic_cast<const torch::optim::AdamOptions*>(&options)) return adam("Adam", *o);
  if (const auto* o = dynamic_cast<const torch::optim::SGDOptions*>(&options)) {
    return {"SGD", o->momentum() > 0 ? std::vector<std::string>{"momentum_buffer"} : std::vector<std::string>{},
            {{"momentum", number(o->momentum())}, {"dampening", number(o->dampening())},
             {"weight_decay", number(o->weight_decay())}, {"nesterov", flag(o->nesterov())}},
            false};
  }
  if (const auto* o = dynamic_cast<const torch::optim::RMSpropOptions*>(&options)) {
    std::vector<std::string> fields = {"square_avg"};
    if (o->momentum() > 0) fields.push_back("momentum_buffer");
    if (o->centered()) fields.push_back("grad_avg");
    return {"RMSprop", fields,
            {{"alpha", number(o->alpha())}, {"eps", number(o->eps())}, {"weight_decay", number(o->weight_decay())},
             {"momentum", number(o->momentum())}, {"centered", flag(o->centered())}},
            true};
  }
  throw InvalidArgument("`init_optimizer` continues SGD, Adam, AdamW or RMSprop; this run's optimizer is none of them");
}

// Which of PyTorch's optimizers saved this state, by its fields and (Adam against AdamW) the group's
// decoupled_weight_decay, which PyTorch 2.x writes; "" where the fields say nothing (SGD without momentum).
std::string saved_optimizer(const TensorFile& saved, const std::string& first_parameter) {
  const std::string state = "optimizer.state." + first_parameter + ".";
  if (saved.find(state + "exp_avg").defined()) {
    const auto decoupled = saved.metadata.find(std::string(kGroup) + "decoupled_weight_decay");
    if (decoupled == saved.metadata.end()) return "Adam or AdamW";
    return decoupled->second == "true" ? "AdamW" : "Adam";
  }
  if (saved.find(state + "square_avg").defined()) return "RMSprop";
  if (saved.find(state + "momentum_buffer").defined()) return "SGD";
  return "";
}

// Numbers agree to float32's precision (PyTorch's floats are doubles that a run may have read from float32).
bool same_value(const std::string& saved, const std::string& run) {
  if (saved == run) return true;
  const auto numbers = [](const std::string& text) {
    std::vector<double> values;
    for (size_t at = 0; at < text.size();) {
      const size_t start = text.find_first_of("0123456789-.", at);
      if (start == std::string::npos) break;
      size_t used = 0;
      try {
        values.push_back(std::stod(text.substr(start), &used));
      } catch (const std::exception&) {
        return std::vector<double>{};
      }
      at = start + std::max<size_t>(used, 1);
    }
    return values;
  };
  const std::vector<double> a = numbers(saved), b = numbers(run);
  if (a.empty() || a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::abs(a[i] - b[i]) > 1e-6 * std::max(std::abs(a[i]), std::abs(b[i]))) return false;
  }
  return true;
}

// The --optimizer value of the optimizer saved_optimizer() names.
std::string optimizer_flag(const std::string& kind) {
  static const std::map<std::string, std::string> kFlags = {{"AdamW", "adamw"}, {"Adam", "adam"},
                                                            {"Adam or AdamW", "adam or adamw"},
                                                            {"RMSprop", "rmsprop"}, {"SGD", "sgd"},
                                                            {"", "sgd `momentum` 0"}};
  return kFlags.at(kind);
}

std::unique_ptr<torch::optim::OptimizerParamState> new_state(const std::string& optimizer, int64_t step) {
  if (optimizer == "AdamW") return std::make_unique<torch::optim::AdamWParamState>(torch::optim::AdamWParamState().step(step));
  if (optimizer == "Adam") return std::make_unique<torch::optim::AdamParamState>(torch::optim::AdamParamState().step(step));
  if (optimizer == "RMSprop") return std::make_unique<torch::optim::RMSpropParamState>(torch::optim::RMSpropParamState().step(step));
  return std::make_unique<torch::optim::SGDParamState>();
}

}  // namespace

ImportedOptimizerState import_optimizer_state(const TensorFile& saved, const torch::nn::Module& module,
                                              torch::optim::Optimizer& optimizer, const std::string& source) {
  const auto refuse = [&](const std::string& what) {
    return InvalidArgument(fmt::format("`init_optimizer`: {} {}", source, what));
  };
  TANDEM_CHECK(optimizer.param_groups().size() == 1, "tandem train's optimizer has one param group");
  if (saved.metadata.count("optimizer.param_groups.1.params") != 0) {
    throw refuse("holds several param groups; tandem trains one: drop `init_optimizer`");
  }
  if (saved.metadata.count(std::string(kGroup) + "params") == 0) {
    throw refuse("holds no optimizer state (no optimizer.param_groups.0: save {\"model\": ..., \"optimizer\": ...} as "
                 "get_state_dict gives them); drop `init_optimizer`");
  }
  const RunOptimizer run = describe(optimizer);

  // The trainable parameters by name, in the optimizer's group.
  std::map<const void*, std::string> names;
  for (const auto& item : module.named_parameters()) names[item.value().unsafeGetTensorImpl()] = item.key();
  std::vector<std::pair<std::string, torch::Tensor>> parameters;
  for (const torch::Tensor& parameter : optimizer.param_groups().front().params()) {
    const auto found = names.find(parameter.unsafeGetTensorImpl());
    TANDEM_CHECK(found != names.end(), "an optimizer parameter that is not the module's");
    parameters.emplace_back(found->second, parameter);
  }
  if (parameters.empty()) return {run.name, 0, 0};

  const std::string kind = saved_optimizer(saved, parameters.front().first);
  const bool same_kind = kind.empty() ? run.fields.empty() && run.name == "SGD"
                                      : kind == run.name || (kind == "Adam or AdamW" && run.name.rfind("Adam", 0) == 0);
  if (!same_kind) {
    throw refuse(fmt::format("holds the state of {}, and this run's optimizer is {}: continue with `optimizer` {}, or "
                             "drop `init_optimizer`",
                             kind.empty() ? "SGD without momentum" : kind, run.name, optimizer_flag(kind)));
  }
  if (saved.metadata.count(std::string(kGroup) + "maximize") != 0 && saved.metadata.at(std::string(kGroup) + "maximize") == "true") {
    throw refuse("was saved with maximize=True, which tandem's optimizers do not do: drop `init_optimizer`");
  }
  for (const Setting& setting : run.settings) {
    const auto found = saved.metadata.find(kGroup + setting.key);
    if (found == saved.metadata.end()) continue;  // a hyper-parameter PyTorch's version did not save
    if (!same_value(found->second, setting.value)) {
      throw refuse(fmt::format("was saved with `{}` {}, and this run's is {}: continue with the same, or drop "
                               "`init_optimizer`",
                               setting.key, found->second, setting.value));
    }
  }

  // Every parameter's state, checked before any is set.
  std::vector<std::unique_ptr<torch::optim::OptimizerParamState>> states;
  ImportedOptimizerState imported{run.name, 0, 0};
  for (const auto& [name, parameter] : parameters) {
    const std::string prefix = "optimizer.state." + name + ".";
    int64_t step = 0;
    if (run.has_step) {
      const torch::Tensor saved_step = saved.find(prefix + "step");
      if (!saved_step.defined() || saved_step.numel() != 1) {
        throw refuse(fmt::format("has no step count for '{}' ({}step)", name, prefix));
      }
      step = static_cast<int64_t>(std::llround(saved_step.to(torch::kDouble).item<double>()));
      if (states.empty()) imported.step = step;
    }
    std::unique_ptr<torch::optim::OptimizerParamState> state = new_state(run.name, step);
    std::vector<torch::Tensor> tensors(optim::state_field_names(*state).size());
    const std::vector<std::string> field_names = optim::state_field_names(*state);
    for (const std::string& field : run.fields) {
      const torch::Tensor value = saved.find(prefix + field);
      if (!value.defined()) throw refuse(fmt::format("has no '{}{}' for the parameter '{}'", prefix, field, name));
      if (value.sizes() != parameter.sizes()) {
        throw refuse(fmt::format("holds '{}{}' of shape {}, and the parameter is {}", prefix, field,
                                 fmt::join(value.sizes(), "x"), fmt::join(parameter.sizes(), "x")));
      }
      const size_t at = static_cast<size_t>(std::find(field_names.begin(), field_names.end(), field) - field_names.begin());
      tensors[at] = value.to(parameter.options()).clone();
    }
    states.push_back(optim::with_state_tensors(*state, tensors));
  }
  auto& optimizer_states = optimizer.state();
  for (size_t i = 0; i < parameters.size(); ++i) {
    optimizer_states[compat::optimizer_state_key(parameters[i].second)] = std::move(states[i]);
  }
  imported.parameters = static_cast<int64_t>(parameters.size());
  return imported;
}

}  // namespace tandem::checkpoint
