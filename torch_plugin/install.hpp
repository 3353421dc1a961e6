// Making vramledger torch's CUDA allocator: what torch.cuda.memory.change_current_allocator does
// (CUDACachingAllocator::allocator.store) and also c10::SetAllocator(kCUDA), so code that asks
// c10::GetAllocator(kCUDA) gets vramledger too.
//
// Swapping is only safe before the first CUDA allocation: memory the previous allocator handed
// out would otherwise be freed through the wrong one, and its cached memory would be invisible
// to the ledger. install() checks torch's own statistics for every device and refuses with a
// clear error if the current allocator has allocated anything.
#pragma once

#include <string_view>

namespace vramledger::torch_plugin {

// Installs (idempotent for the same config). Throws c10::Error with the reason on refusal or
// for a malformed config.
void install(std::string_view config_text);

// True when vramledger is torch's current CUDA allocator.
bool installed();

}  // namespace vramledger::torch_plugin
