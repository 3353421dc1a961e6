// Making vramledger torch's CUDA allocator: what torch.cuda.memory.change_current_allocator does
// (CUDACachingAllocator::allocator.store) and also c10::SetAllocator(kCUDA), so code that asks
// c10::GetAllocator(kCUDA) gets vramledger too.
//
// Swapping is only safe before the first CUDA allocation: memory the previous allocator handed
// out would otherwise be freed through the wrong one, and its cached memory would be invisible
// to the ledger. install() checks torch's own statistics for every device and refuses with a
// clear error if the current allocator has allocated anything.
#pragma once

#include <string>
#include <string_view>

namespace vramledger::torch_plugin {

// Installs (idempotent for the same config). Throws c10::Error with the reason on refusal or
// for a malformed config.
void install(std::string_view config_text);

// The torch release loaded in this process ("2.15.0+cu130"), read from the version.py beside the
// libc10.so the process loaded; empty when that is not a wheel's layout.
std::string loaded_torch_version();
// Throws std::runtime_error naming both releases when the loaded torch's major.minor is not the
// one the plugin was compiled against (install() calls it first).
void check_loaded_torch_matches_build();

// True when vramledger is torch's current CUDA allocator.
bool installed();

}  // namespace vramledger::torch_plugin
