#pragma once
// The FileStore through which the workers of a single-node `tandem run` meet (TANDEM_STORE_FILE: LibTorch before
// 2.8, see tandem/launch/local_store.h), in a folder that the launcher makes under TMPDIR and removes after its
// workers. The launcher checks that TMPDIR has room before any worker starts; one that fills during the run made
// c10d's FileStore throw std::system_error ("No space left on device") from whichever call wrote to it, and from
// its destructor, which appends a cleanup count to the file: std::terminate's report in every rank at its exit.
// This store passes every call to the FileStore, turns a write that finds no room into a CommError naming TMPDIR
// and the remedy, and never destroys the FileStore (its file goes with the launcher's folder).
#include <chrono>
#include <string>

#include "tandem/comm/rendezvous.h"

namespace tandem::comm {

// Throws CommError when the file cannot be opened, or TMPDIR has no room for the store's first write.
StorePtr open_launcher_file_store(const std::string& path, int world_size, std::chrono::milliseconds timeout);

}  // namespace tandem::comm
