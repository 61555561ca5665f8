#include "tandem/comm/process_group.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "tandem/comm/backend.h"
#include "tandem/util/error.h"
#include "tandem/util/log.h"

namespace tandem {
namespace {
std::unique_ptr<ProcessGroup> default_group_;
}  // namespace

ProcessGroup::ProcessGroup(comm::RankLayout layout, comm::StorePtr store, comm::CommunicatorPtr communicator)
    : layout_(std::move(layout)), store_(std::move(store)), communicator_(std::move(communicator)) {}

ProcessGroup& init_process_group(const InitOptions& options) {
  if (default_group_) throw InvalidArgument("init_process_group() was already called in this process");
  comm::RankLayout layout = comm::detect_rank_layout(options.layout);
  log::set_identity(layout.rank, layout.world_size);
  std::string backend = options.backend.empty() ? comm::default_backend() : options.backend;
  // A world of one needs no network: an in-memory store keeps single-process runs free of ports.
  comm::StorePtr store = layout.distributed() && backend != "mpi"
                             ? comm::make_store(options.init_method, layout, options.timeout)
                             : comm::StorePtr(c10::make_intrusive<c10d::HashStore>());
  if (layout.distributed() && backend != "mpi") comm::join(*store, layout.rank, layout.world_size, options.timeout);
  comm::CommunicatorPtr communicator = comm::make_communicator(backend, store, layout, options.timeout);
  default_group_ = std::make_unique<ProcessGroup>(layout, store, communicator);
  return *default_group_;
}

void destroy_process_group() { default_group_.reset(); }

bool is_initialized() { return default_group_ != nullptr; }

ProcessGroup& default_group() {
  if (!default_group_) throw InvalidArgument("call tandem::init_process_group() before using the default group");
  return *default_group_;
}

int rank() { return default_group_ ? default_group_->layout().rank : 0; }
int world_size() { return default_group_ ? default_group_->layout().world_size : 1; }
int local_rank() { return default_group_ ? default_group_->layout().local_rank : 0; }
bool is_main_process() { return rank() == 0; }

torch::Tensor reduce_value(torch::Tensor value, bool average) {
  if (world_size() < 2) return value;
  default_group_->communicator().all_reduce(value, average ? comm::ReduceOp::Avg : comm::ReduceOp::Sum)->wait();
  return value;
}

void barrier() {
  if (world_size() < 2) return;
  default_group_->communicator().barrier()->wait();
}

}  // namespace tandem
