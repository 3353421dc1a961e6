// CUDA IPC in the torch plugin (docs/ipc.md): VramledgerAllocator::shareIpcHandle exports the
// cudaMalloc segment under a block (kind 'c') or the paged heap's chunks under it (kind 'v'),
// getIpcDevPtr maps one another process exported; both are defined in cuda_ipc.cpp. The exporter's block stays allocated until every importer released it:
// torch itself keeps the storage's original DataPtr (ours) in its CudaIPCSentData, and in its limbo
// after the producer dropped the tensor, until the shared reference counter falls to zero.
#pragma once

#include <vector>

#include "torch_plugin/ipc_imports.hpp"

namespace vramledger::torch_plugin {

// The process's imports, never destroyed (tensors may be freed during static destruction).
// Over the simulated driver when vramledger is configured with backend:simulated.
ImportedMemory& imported_memory();

// Called as a block is freed: a paged block that was exported lets go of its chunks' file
// descriptors (closed once no exported block uses them). One relaxed load when nothing is.
void release_ipc_export(void* ptr) noexcept;

// Paged blocks exported as file descriptors and not yet freed. Their pages must not sleep
// (docs/sleep.md): the descriptors and the importers' mappings would keep the old memory alive
// outside the books, and the wake would give the exporter new pages the importers never see.
std::vector<DevicePtr> ipc_exported_blocks();

}  // namespace vramledger::torch_plugin
