#pragma once
// The process-wide group a training program joins once: init_process_group() finds the rank layout (see
// rank_layout.h), meets the other ranks and connects the backend. The free functions below (rank(),
// world_size(), reduce_value(), ...) are the seeds' helpers and work before initialisation too, as a single
// process.
#include <chrono>
#include <memory>
#include <string>

#include "tandem/comm/communicator.h"
#include "tandem/comm/membership.h"
#include "tandem/comm/rank_layout.h"
#include "tandem/comm/rendezvous.h"

namespace tandem {

inline constexpr std::chrono::minutes kDefaultTimeout{5};

struct InitOptions {
  // "cpu", "cuda" or "auto" (see util/device.h): where this rank computes; a CUDA rank takes GPU LOCAL_RANK.
  std::string device = "cpu";
  // "gloo", "mpi", "nccl"; empty picks comm::default_backend() for the device.
  std::string backend;
  // "env://", "tcp://HOST:PORT" or "file:///PATH".
  std::string init_method = "env://";
  // Explicit values win over the environment.
  comm::ExplicitLayout layout;
  // Deadline for the rendezvous and for every collective.
  std::chrono::milliseconds timeout = kDefaultTimeout;
};

class ProcessGroup {
 public:
  ProcessGroup(comm::RankLayout layout, torch::Device device, comm::StorePtr store,
               comm::CommunicatorPtr communicator, std::shared_ptr<comm::Membership> membership = nullptr);

  const comm::RankLayout& layout() const { return layout_; }
  // The device this rank computes on (InitOptions::device resolved); the current CUDA device when a GPU.
  const torch::Device& device() const { return device_; }
  // Under in-job recovery, the current membership epoch's (null in a replacement not yet taken in).
  comm::Communicator& communicator() const { return *communicator_ptr(); }
  const comm::CommunicatorPtr& communicator_ptr() const {
    return membership_ ? membership_->communicator() : communicator_;
  }
  // Under `tandem run --recovery in-job` (TANDEM_RECOVERY=in-job), the job's membership; null otherwise.
  const std::shared_ptr<comm::Membership>& membership() const { return membership_; }
  // The rendezvous store, for small out-of-band agreements (e.g. a run directory name).
  c10d::Store& store() const { return *store_; }

 private:
  comm::RankLayout layout_;
  torch::Device device_;
  comm::StorePtr store_;
  comm::CommunicatorPtr communicator_;
  std::shared_ptr<comm::Membership> membership_;
};

// Joins the group (once per process; a second call throws). With no layout in the environment it sets up a
// world of one, like the seeds' "Not using distributed mode". Under `tandem run --recovery in-job` the group
// also holds the job's membership; a replacement of a lost worker (TANDEM_RECOVERY_REPLACEMENT) meets nobody
// here and has no communicator until the training loop has it taken in (docs/recovery.md).
ProcessGroup& init_process_group(const InitOptions& options = {});
void destroy_process_group();
bool is_initialized();
// Throws InvalidArgument if init_process_group() has not run.
ProcessGroup& default_group();
// What the wrappers' constructors without a communicator use (DistributedDataParallel, FullyShardedDataParallel):
// the default group's communicator, or null (a world of one) before init_process_group().
comm::CommunicatorPtr default_communicator();

int rank();
int world_size();
int local_rank();
bool is_main_process();

// Sum (or mean, with average) of `value` over all ranks, on `value`'s own device whatever the backend; returns
// `value` itself in a world of one.
torch::Tensor reduce_value(torch::Tensor value, bool average = true);
void barrier();

}  // namespace tandem
