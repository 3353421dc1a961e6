// Return address -> category, with a small lock-free cache so the loader is asked once per call
// site rather than once per call.
#pragma once

#include "preload/categories.hpp"

namespace vramledger::preload {

// return_address: __builtin_return_address(0) of an interposed function.
Category category_of_caller(const void* return_address);

}  // namespace vramledger::preload
