// A checkpoint's optimizer state in PyTorch's terms (optimizer_export.h).
#include "optimizer_export.h"

#include <fmt/format.h>
#include <torch/serialize/input-archive.h>

#include <map>

#include "checkpoint_fields.h"
#include "checkpoint_optimizer.h"
#include "pickle.h"
#include "tandem/util/error.h"

namespace tandem::checkpoint {
namespace {

// One key of PyTorch's param group: LibTorch's option of the same name where it has one, else PyTorch's default.
struct GroupKey {
  const char* key;
  enum class Kind { kNumber, kFlag, kBetas, kNone } kind;
  double fallback = 0;
};

using Key = GroupKey::Kind;

// PyTorch 2.x's param group keys, in its order, for each optimizer tandem trains with.
const std::map<std::string, std::vector<GroupKey>>& group_keys() {
  static const std::map<std::string, std::vector<GroupKey>> keys = {
      {"AdamW", {{"lr", Key::kNumber}, {"betas", Key::kBetas}, {"eps", Key::kNumber}, {"weight_decay", Key::kNumber},
                 {"amsgrad", Key::kFlag}, {"maximize", Key::kFlag}, {"foreach", Key::kNone},
                 {"capturable", Key::kFlag}, {"differentiable", Key::kFlag}, {"fused", Key::kNone},
                 {"decoupled_weight_decay", Key::kFlag, 1}}},
      {"Adam", {{"lr", Key::kNumber}, {"betas", Key::kBetas}, {"eps", Key::kNumber}, {"weight_decay", Key::kNumber},
                {"amsgrad", Key::kFlag}, {"maximize", Key::kFlag}, {"foreach", Key::kNone},
                {"capturable", Key::kFlag}, {"differentiable", Key::kFlag}, {"fused", Key::kNone},
                {"decoupled_weight_decay", Key::kFlag, 0}}},
      {"SGD", {{"lr", Key::kNumber}, {"momentum", Key::kNumber}, {"dampening", Key::kNumber},
               {"weight_decay", Key::kNumber}, {"nesterov", Key::kFlag}, {"maximize", Key::kFlag},
               {"foreach", Key::kNone}, {"differentiable", Key::kFlag}, {"fused", Key::kNone}}},
      {"RMSprop", {{"lr", Key::kNumber}, {"alpha", Key::kNumber}, {"eps", Key::kNumber},
                   {"weight_decay", Key::kNumber}, {"momentum", Key::kNumber}, {"centered", Key::kFlag},
                   {"capturable", Key::kFlag}, {"foreach", Key::kNone}, {"maximize", Key::kFlag},
                   {"differentiable", Key::kFlag}}},
  };
  return keys;
}

// PyTorch's class for LibTorch's ("torch::optim::AdamW"), "" for any other.
std::string pytorch_class(const std::string& kind) {
  for (const char* name : {"AdamW", "Adam", "SGD", "RMSprop"}) {
    if (kind == std::string("torch::optim::") + name) return name;
  }
  return "";
}

double number_of(const c10::IValue& value) {
  if (value.isDouble()) return value.toDouble();
  if (value.isInt()) return static_cast<double>(value.toInt());
  if (value.isBool()) return value.toBool() ? 1 : 0;
  throw InvalidArgument("not a number");
}

std::string pickled(const GroupKey& key, torch::serialize::InputArchive& options) {
  c10::IValue value;
  const bool has = options.try_read(key.key, value);
  PickleWriter pickle;
  switch (key.kind) {
    case Key::kNone: pickle.none(); break;
    case Key::kFlag: pickle.boolean(has ? number_of(value) != 0 : key.fallback != 0); break;
    case Key::kNumber: pickle.real(has ? number_of(value) : key.fallback); break;
    case Key::kBetas: {
      if (!has || !value.isTuple() || value.toTupleRef().elements().size() != 2) {
        throw InvalidArgument("its optimizer's betas are not a pair");
      }
      for (const c10::IValue& beta : value.toTupleRef().elements()) pickle.real(number_of(beta));
      pickle.tuple(2);
      break;
    }
  }
  return pickle.finish();
}

}  // namespace

ExportedOptimizer export_optimizer_state(const TensorFile& file, const std::string& path,
                                         const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors) {
  ExportedOptimizer exported;
  const std::string kind = optional_meta(file, "optimizer", "");
  exported.optimizer = pytorch_class(kind);
  if (exported.optimizer.empty()) {
    throw InvalidArgument(fmt::format("{}: its optimizer ({}) has no PyTorch counterpart that DCP could hold; tandem "
                                      "converts the state of SGD, Adam, AdamW and RMSprop",
                                      path, kind.empty() ? "none recorded" : kind));
  }
  const torch::Tensor bytes = file.find(kOptimizerArchive);
  if (!bytes.defined() || optional_meta(file, "optimizer_fingerprint", "") != archive_fingerprint(bytes)) {
    throw InvalidArgument(path + ": the optimizer state is missing or damaged");
  }
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(bytes.numel()));
    torch::serialize::InputArchive groups, group, options, states;
    archive.read("param_groups", groups);
    torch::Tensor group_count;
    groups.read("param_groups/size", group_count);
    if (group_count.item<int64_t>() != 1) {
      throw InvalidArgument(fmt::format("{}: its optimizer has {} param groups; DCP's conversion takes one", path,
                                        group_count.item<int64_t>()));
    }
    groups.read("param_groups/0", group);
    group.read("options", options);
    archive.read("state", states);
    torch::Tensor count;
    group.read("params/size", count);
    if (count.item<int64_t>() < 0 || count.item<int64_t>() > static_cast<int64_t>(tensors.size())) {
      throw InvalidArgument(fmt::format("{}: its optimizer steps {} tensors, and the model has {} (the file is "
                                        "damaged)", path, count.item<int64_t>(), tensors.size()));
    }
    const std::vector<std::pair<std::string, std::vector<int64_t>>> parameters(
        tensors.begin(), tensors.begin() + count.item<int64_t>());
    PickleWriter names;
    names.empty_list();
    names.mark();
    for (size_t i = 0; i < parameters.size(); ++i) {
      const auto& [name, shape] = parameters[i];
      names.string(name);
      c10::IValue key;
      group.read("params/" + std::to_string(i), key);
      torch::serialize::InputArchive state;
      if (!states.try_read(key.toStringRef(), state)) continue;  // no step taken for it yet
      c10::IValue step;
      if (exported.optimizer != "SGD" && state.try_read("step", step)) {
        exported.tensors.emplace_back(fmt::format("optimizer.state.{}.step", name),
                                      torch::tensor(number_of(step), torch::kFloat32).reshape({}));
      }
      for (const char* field : {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "square_avg", "grad_avg"}) {
        torch::Tensor value;
        if (!state.try_read(field, value) || !value.defined()) continue;
        if (value.sizes() != c10::IntArrayRef(shape)) {
          throw InvalidArgument(fmt::format("{}: the optimizer's {} of '{}' does not have the parameter's shape (the "
                                            "file is damaged)", path, field, name));
        }
        exported.tensors.emplace_back(fmt::format("optimizer.state.{}.{}", name, field), value.contiguous());
      }
    }
    names.appends_from_mark();
    for (const GroupKey& key : group_keys().at(exported.optimizer)) {
      exported.param_group.push_back({fmt::format("optimizer.param_groups.0.{}", key.key), pickled(key, options)});
    }
    exported.param_group.push_back({"optimizer.param_groups.0.params", names.finish()});
  } catch (const c10::Error& error) {
    throw InvalidArgument(fmt::format("{}: its optimizer state cannot be read ({})", path,
                                      error.what_without_backtrace()));
  } catch (const InvalidArgument& error) {
    const std::string what = error.what();
    if (what.rfind(path, 0) == 0) throw;
    throw InvalidArgument(fmt::format("{}: {} (the file is damaged)", path, what));
  }
  return exported;
}

}  // namespace tandem::checkpoint
