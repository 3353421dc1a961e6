#include "tests/gpu/pattern_kernels.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>

#include "allocator/cuda/cuda_status.hpp"

namespace vramledger::gpu_test {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 4096;

// splitmix64 of (seed, word index): cheap, and neighbouring words differ in every byte.
__host__ __device__ inline std::uint64_t pattern_word(std::uint32_t seed, std::uint64_t word) {
  std::uint64_t z = (static_cast<std::uint64_t>(seed) << 32) + word * 0x9E3779B97F4A7C15ull +
                    0xD1B54A32D192ED03ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__host__ __device__ inline std::uint8_t byte_of(std::uint32_t seed, std::uint64_t offset) {
  return static_cast<std::uint8_t>(pattern_word(seed, offset / 8) >> (8 * (offset % 8)));
}

__global__ void fill_kernel(std::uint8_t* base, std::size_t bytes, std::uint32_t seed,
                            std::uint64_t first_offset) {
  const std::size_t words = bytes / 8;
  const std::uint64_t first_word = first_offset / 8;
  auto* as_words = reinterpret_cast<std::uint64_t*>(base);
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < words;
       i += stride) {
    as_words[i] = pattern_word(seed, first_word + i);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    for (std::size_t i = words * 8; i < bytes; ++i) base[i] = byte_of(seed, first_offset + i);
  }
}

__global__ void check_kernel(const std::uint8_t* base, std::size_t bytes, std::uint32_t seed,
                             std::uint64_t first_offset, unsigned long long* counter) {
  const std::size_t words = bytes / 8;
  const std::uint64_t first_word = first_offset / 8;
  const auto* as_words = reinterpret_cast<const std::uint64_t*>(base);
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  unsigned long long wrong = 0;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < words;
       i += stride) {
    const std::uint64_t diff = as_words[i] ^ pattern_word(seed, first_word + i);
    if (diff != 0) {
      for (int b = 0; b < 8; ++b) wrong += ((diff >> (8 * b)) & 0xFF) != 0 ? 1 : 0;
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    for (std::size_t i = words * 8; i < bytes; ++i) {
      wrong += base[i] != byte_of(seed, first_offset + i) ? 1 : 0;
    }
  }
  if (wrong != 0) atomicAdd(counter, wrong);
}

__global__ void spin_kernel(std::uint64_t nanoseconds) {
  std::uint64_t start = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  std::uint64_t now = start;
  while (now - start < nanoseconds) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
}

int blocks_for(std::size_t bytes) {
  const std::size_t words = std::max<std::size_t>(bytes / 8, 1);
  return static_cast<int>(
      std::min<std::size_t>((words + kThreads - 1) / kThreads, static_cast<std::size_t>(kMaxBlocks)));
}

Status check_alignment(std::uintptr_t ptr, std::uint64_t first_offset, const char* what) {
  if (ptr % 8 == 0 && first_offset % 8 == 0) return Status::ok();
  return {ErrorCode::kInvalidArgument,
          std::string(what) + ": pointer and offset must be multiples of 8"};
}

std::string launch_args(std::uintptr_t ptr, std::size_t bytes, std::uintptr_t stream) {
  return "ptr=" + describe_address(ptr) + ", bytes=" + describe_bytes(bytes) +
         ", stream=" + describe_address(stream);
}

}  // namespace

std::uint8_t pattern_byte(std::uint32_t seed, std::uint64_t offset) {
  return byte_of(seed, offset);
}

Status fill_pattern(std::uintptr_t ptr, std::size_t bytes, std::uint32_t seed,
                    std::uintptr_t stream, std::uint64_t first_offset) {
  if (Status s = check_alignment(ptr, first_offset, "fill_pattern"); !s.is_ok()) return s;
  if (bytes == 0) return Status::ok();
  fill_kernel<<<blocks_for(bytes), kThreads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<std::uint8_t*>(ptr), bytes, seed, first_offset);
  return runtime_status(cudaGetLastError(), "fill_kernel<<<>>>", launch_args(ptr, bytes, stream));
}

Status count_mismatches(std::uintptr_t ptr, std::size_t bytes, std::uint32_t seed,
                        std::uintptr_t stream, std::uintptr_t counter,
                        std::uint64_t first_offset) {
  if (Status s = check_alignment(ptr, first_offset, "count_mismatches"); !s.is_ok()) return s;
  if (bytes == 0) return Status::ok();
  check_kernel<<<blocks_for(bytes), kThreads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const std::uint8_t*>(ptr), bytes, seed, first_offset,
      reinterpret_cast<unsigned long long*>(counter));
  return runtime_status(cudaGetLastError(), "check_kernel<<<>>>", launch_args(ptr, bytes, stream));
}

Status spin(std::uint64_t nanoseconds, std::uintptr_t stream) {
  spin_kernel<<<1, 1, 0, reinterpret_cast<cudaStream_t>(stream)>>>(nanoseconds);
  return runtime_status(cudaGetLastError(), "spin_kernel<<<>>>",
                        "ns=" + std::to_string(nanoseconds) + ", stream=" + describe_address(stream));
}

}  // namespace vramledger::gpu_test
