// Parameters that get no gradient in a step are not stepped, as in plain training, DDP and FSDP2: a child the
// forward never calls keeps its values bit for bit under momentum, weight decay and AdamW; a child only some ranks
// call is stepped with the average in which the others count zero, as DDP's find_unused_parameters steps it.
#include <gtest/gtest.h>

#include "fsdp_fixtures.h"
#include "tandem/fsdp/unused_parameters.h"

namespace tandem::testing {
namespace {

// Two Linears in one module: `optional` runs only where the forward asks for it, `spare` never. With each direct
// child of the net a unit, they share the body's unit with `always`, which every rank gathers.
struct BodyImpl : torch::nn::Module {
  BodyImpl()
      : always(register_module("always", torch::nn::Linear(16, 16))),
        optional(register_module("optional", torch::nn::Linear(16, 16))),
        spare(register_module("spare", torch::nn::Linear(16, 16))) {}
  torch::Tensor forward(const torch::Tensor& x, bool use_optional) {
    torch::Tensor h = torch::relu(always(x));
    return use_optional ? torch::relu(optional(h)) : h;
  }
  torch::nn::Linear always, optional, spare;
};
TORCH_MODULE(Body);

// stem, body and head run in that order; `unused` (a unit of its own) never does.
struct SkippingNetImpl : torch::nn::Module {
  SkippingNetImpl()
      : stem(register_module("stem", torch::nn::Linear(8, 16))),
        body(register_module("body", Body())),
        unused(register_module("unused", torch::nn::Linear(16, 16))),
        head(register_module("head", torch::nn::Linear(16, 4))) {}
  torch::Tensor forward(const torch::Tensor& x, bool use_optional) {
    return head(body(torch::relu(stem(x)), use_optional));
  }
  torch::nn::Linear stem;
  Body body;
  torch::nn::Linear unused, head;
};
TORCH_MODULE(SkippingNet);

SkippingNet make_net(uint64_t seed) {
  return seeded(seed, [] { return SkippingNet(); });
}

NamedTensors parameters_of(torch::nn::Module& module) {
  NamedTensors result;
  for (const auto& entry : module.named_parameters()) result.emplace_back(entry.key(), entry.value().detach().clone());
  return result;
}

// Which ranks run body.optional in which step.
using UsesOptional = std::function<bool(int rank, int step)>;

// Steps of SGD (momentum, weight decay) or AdamW on random batches, each through `optimizer_step`.
template <typename Wrapper>
void train(Wrapper& model, torch::optim::Optimizer& optimizer, int rank, const UsesOptional& uses_optional,
           const std::function<void()>& optimizer_step) {
  for (int step = 0; step < 4; ++step) {
    optimizer.zero_grad();
    auto gen = generator(500 + 10 * step + rank);
    torch::Tensor x = torch::randn({4, 8}, gen);
    torch::Tensor y = torch::randint(4, {4}, gen);
    torch::nn::functional::cross_entropy(model(x, uses_optional(rank, step)), y).backward();
    optimizer_step();
  }
}

NamedTensors run(const std::string& optimizer_kind, bool fsdp, const UsesOptional& uses_optional) {
  FsdpScenario s;
  s.optimizer = optimizer_kind;
  return on_thread_ranks(s, [&](int rank, comm::Communicator& communicator) {
    SkippingNet net = make_net(11 + rank);
    if (fsdp) {
      fsdp::FullyShardedDataParallel<SkippingNet> model(net, borrow(communicator));
      auto optimizer = make_optimizer(s, model.parameters());
      train(model, *optimizer, rank, uses_optional,
            [&] { fsdp::step_leaving_unused(model.sharded(), *optimizer, [&] { optimizer->step(); }); });
      return model.full_parameters();
    }
    ddp::DdpOptions options;
    options.find_unused_parameters = true;
    ddp::DistributedDataParallel<SkippingNet> model(net, borrow(communicator), options);
    auto optimizer = make_optimizer(s, model.parameters());
    train(model, *optimizer, rank, uses_optional, [&] { optimizer->step(); });
    return parameters_of(*net);
  });
}

torch::Tensor find(const NamedTensors& tensors, const std::string& name) {
  for (const auto& [key, value] : tensors) {
    if (key == name) return value;
  }
  ADD_FAILURE() << "no parameter " << name;
  return torch::zeros({1});
}

class FsdpUnusedParameters : public ::testing::TestWithParam<std::string> {};

// `unused` (a unit of its own) and body.spare (in a unit that trains) got no gradient on any rank in any step:
// they end bit for bit where rank 0 started them.
TEST_P(FsdpUnusedParameters, AChildNoRankCallsKeepsItsValuesBitForBit) {
  const NamedTensors start = parameters_of(*make_net(11));
  const NamedTensors trained = run(GetParam(), /*fsdp=*/true, [](int, int) { return true; });
  for (const std::string name : {"unused.weight", "unused.bias", "body.spare.weight", "body.spare.bias"}) {
    EXPECT_TRUE(torch::equal(find(trained, name), find(start, name))) << name << " moved";
  }
  EXPECT_FALSE(torch::equal(find(trained, "body.always.weight"), find(start, "body.always.weight")));
}

// body.optional runs on rank 0 only: stepped with the average of rank 0's gradient and rank 1's zero, as DDP with
// find_unused_parameters steps it; the unit after it in backward still pairs its reduction with rank 1's.
TEST_P(FsdpUnusedParameters, AChildOneRankCallsTrainsAsUnderDdp) {
  const auto rank_zero_only = [](int rank, int) { return rank == 0; };
  const NamedTensors expected = run(GetParam(), /*fsdp=*/false, rank_zero_only);
  const NamedTensors got = run(GetParam(), /*fsdp=*/true, rank_zero_only);
  const double difference = relative_l2(got, expected);
  std::printf("[fsdp unused] %s, body.optional on rank 0 only, 4 steps: relative L2 against DDP %.3g\n",
              GetParam().c_str(), difference);
  EXPECT_LE(difference, kFsdpRelativeTolerance);
  const NamedTensors start = parameters_of(*make_net(11));
  EXPECT_FALSE(torch::equal(find(got, "body.optional.weight"), find(start, "body.optional.weight")));
  EXPECT_TRUE(torch::equal(find(got, "unused.weight"), find(start, "unused.weight")));
}

// body.optional runs from the third step on: until then its elements of the body's shard and their momentum stay
// as they were (none, for a fresh state), so from then on it trains as DDP trains it. SGD only: Adam's step count
// is one per shard, and a parameter that starts later in a shard starts with the shard's count.
TEST(FsdpUnusedParametersLater, AChildCalledFromTheThirdStepOnTrainsAsUnderDdp) {
  const auto from_third_step = [](int, int step) { return step >= 2; };
  const double difference =
      relative_l2(run("sgd", /*fsdp=*/true, from_third_step), run("sgd", /*fsdp=*/false, from_third_step));
  std::printf("[fsdp unused] sgd, body.optional from step 3 on: relative L2 against DDP %.3g\n", difference);
  EXPECT_LE(difference, kFsdpRelativeTolerance);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, FsdpUnusedParameters, ::testing::Values("sgd", "adamw"));

}  // namespace
}  // namespace tandem::testing
