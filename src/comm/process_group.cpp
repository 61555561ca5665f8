#include "tandem/comm/process_group.h"

#include "tandem/comm/backend.h"
#include "tandem/comm/value_collectives.h"
#include "tandem/util/device.h"
#include "tandem/util/error.h"
#include "tandem/util/log.h"

namespace tandem {
namespace {
std::unique_ptr<ProcessGroup> default_group_;
}  // namespace

ProcessGroup::ProcessGroup(comm::RankLayout layout, torch::Device device, comm::StorePtr store,
                           comm::CommunicatorPtr communicator, std::shared_ptr<comm::Membership> membership)
    : layout_(std::move(layout)),
      device_(device),
      store_(std::move(store)),
      communicator_(std::move(communicator)),
      membership_(std::move(membership)) {}

ProcessGroup& init_process_group(const InitOptions& options) {
  if (default_group_) throw InvalidArgument("init_process_group() was already called in this process");
  comm::require_whole_rank_environment(options.layout);
  comm::RankLayout layout = comm::detect_rank_layout(options.layout);
  log::set_identity(layout.rank, layout.world_size);
  const torch::Device device = select_device(options.device, layout.local_rank);
  make_current(device);
  std::string backend = options.backend.empty() ? comm::default_backend(device) : options.backend;
  comm::StorePtr store = comm::make_rendezvous_store(backend, options.init_method, layout, options.timeout);
  const comm::RecoveryRole role = comm::recovery_role(backend, layout);
  if (layout.distributed() && role != comm::RecoveryRole::kReplacement) {
    comm::join(store, layout.rank, layout.world_size, options.timeout);
  }
  comm::CommunicatorPtr communicator =
      role == comm::RecoveryRole::kReplacement ? nullptr
                                               : comm::make_communicator(backend, store, layout, options.timeout, device);
  std::shared_ptr<comm::Membership> membership;
  if (role != comm::RecoveryRole::kNone) {
    // An epoch's communicator is this backend's over the epoch's keys, its ranks numbered among the members.
    auto connect = [backend, layout, timeout = options.timeout, device](const comm::StorePtr& epoch_store, int rank,
                                                                         int world) {
      comm::RankLayout epoch_layout = layout;
      epoch_layout.rank = rank;
      epoch_layout.world_size = world;
      return comm::make_communicator(backend, epoch_store, epoch_layout, timeout, device);
    };
    membership = std::make_shared<comm::Membership>(store, layout.rank, layout.world_size, connect, communicator,
                                                    options.timeout);
  }
  default_group_ = std::make_unique<ProcessGroup>(layout, device, store, communicator, std::move(membership));
  return *default_group_;
}

void destroy_process_group() { default_group_.reset(); }

bool is_initialized() { return default_group_ != nullptr; }

ProcessGroup& default_group() {
  if (!default_group_) throw InvalidArgument("call tandem::init_process_group() before using the default group");
  return *default_group_;
}

comm::CommunicatorPtr default_communicator() { return default_group_ ? default_group_->communicator_ptr() : nullptr; }

int rank() { return default_group_ ? default_group_->layout().rank : 0; }
int world_size() { return default_group_ ? default_group_->layout().world_size : 1; }
int local_rank() { return default_group_ ? default_group_->layout().local_rank : 0; }
bool is_main_process() { return rank() == 0; }

torch::Tensor reduce_value(torch::Tensor value, bool average) {
  if (world_size() < 2) return value;
  comm::all_reduce_values(default_group_->communicator(), value, average ? comm::ReduceOp::Avg : comm::ReduceOp::Sum);
  return value;
}

void barrier() {
  if (world_size() < 2) return;
  default_group_->communicator().barrier()->wait();
}

}  // namespace tandem
