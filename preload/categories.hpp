// Which library a caller belongs to, from the path of the object that holds its code.
#pragma once

#include "abi/vramledger_preload.h"

namespace vramledger::preload {

using Category = vramledger_preload_category;
inline constexpr int kCategoryCount = VRAMLEDGER_PRELOAD_CATEGORY_COUNT;

// path: the object's file name as the loader knows it (dladdr's dli_fname); nullptr when no
// object maps the caller (JIT'd code). Plain string scans: no allocation, safe inside hooks.
Category classify_object_path(const char* path);

const char* category_name(int category);

}  // namespace vramledger::preload
