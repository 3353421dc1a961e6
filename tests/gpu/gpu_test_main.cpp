// main() of the GPU test binaries: without a usable CUDA device the whole binary reports itself
// skipped (exit status 77, Meson's "skipped"), so a machine without a GPU never counts these
// suites as passed. Individual tests still GTEST_SKIP with the reason when run directly.
#include <gtest/gtest.h>

#include <cstdio>

#include "allocator/cuda/cuda_backend_factory.hpp"

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (!vramledger::cuda_device_available()) {
    std::printf("SKIPPED: no CUDA device: %s\n",
                vramledger::cuda_device_unavailable_reason().c_str());
    return 77;
  }
  return RUN_ALL_TESTS();
}
