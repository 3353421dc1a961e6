// torch's own allocator settings that vramledger honours: the ones PYTORCH_CUDA_ALLOC_CONF and
// torch.cuda.memory._set_allocator_settings() set in torch's CUDAAllocatorConfig, read where
// torch's allocator reads them, so a program that tunes torch's allocator gets the same
// statistics from vramledger.
//
//   roundup_power2_divisions   requests are rounded up to the next of N divisions between two
//                              powers of two (allocated_bytes grows by that block, requested by
//                              the bytes asked), read at every request since it may change at
//                              run time
//   per_process_memory_fraction  the initial memory fraction of every device (torch.cuda.
//                              set_per_process_memory_fraction changes it later)
//
// The other keys configure torch's own segment layout (max_split_size_mb,
// expandable_segments, garbage_collection_threshold, ...) and have vramledger equivalents in
// its own configuration (docs/configuration.md).
#pragma once

#include <cstddef>

namespace vramledger::torch_plugin {

// The block size torch's roundup_power2_divisions gives a request of `bytes`, or 0 when that
// setting leaves the request to vramledger's own rounding.
std::size_t torch_power2_division_block(std::size_t bytes);

// torch's per_process_memory_fraction setting (1.0 when unset). Throws c10::Error for an invalid
// value, with torch's own message, as torch's allocator does at initialisation.
double torch_configured_memory_fraction();

}  // namespace vramledger::torch_plugin
