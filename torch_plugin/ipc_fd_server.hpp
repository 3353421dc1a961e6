// Hands the exporting process's file descriptors (cuMemExportToShareableHandle of the paged heap's
// physical chunks) to importing processes: a Unix socket in the abstract namespace,
// "vramledger-ipc-<pid>", the descriptors passed with SCM_RIGHTS; only descriptors currently
// offered, only to processes of the same user (SO_PEERCRED). (docs/ipc.md)
//
// Not pidfd_getfd (what torch uses for expandable segments): it needs ptrace rights over the
// exporter, which Yama's ptrace_scope 1 refuses to a process that is not its ancestor (two
// workers of one torch.multiprocessing pool) and Docker's default seccomp profile refuses without
// CAP_SYS_PTRACE.
#pragma once

#include <cstdint>
#include <vector>

#include "allocator/errors.hpp"

namespace vramledger::torch_plugin {

// Offers `fd` (owned by the caller) to importers, starting the server thread on first use.
Status offer_fd(int fd);
// Stops offering `fd` (the caller closes it afterwards).
void withdraw_fd(int fd);

// Asks process `pid` for `fds` (its numbers); *out gets this process's copies in the same order
// (the caller closes them). Fails with the reason: no such server (the process ended), a
// descriptor no longer offered, a timeout.
Status fetch_fds(std::uint32_t pid, const std::vector<int>& fds, std::vector<int>* out);

}  // namespace vramledger::torch_plugin
