// Small device kernels the GPU tests use to prove memory is real, private and ordered: every byte
// gets a value that depends on a seed and on its offset, so overlapping allocations, lost data
// after a remap and reuse before another stream finished all show up as mismatches.
#pragma once

#include <cstddef>
#include <cstdint>

#include "allocator/errors.hpp"

namespace vramledger::gpu_test {

// Expected value of the byte at `offset` of a buffer filled with `seed`.
std::uint8_t pattern_byte(std::uint32_t seed, std::uint64_t offset);

// Writes the pattern to [ptr, ptr + bytes) on `stream` (asynchronously). Byte i gets
// pattern_byte(seed, first_offset + i); ptr and first_offset must be multiples of 8.
Status fill_pattern(std::uintptr_t ptr, std::size_t bytes, std::uint32_t seed,
                    std::uintptr_t stream, std::uint64_t first_offset = 0);

// Adds the number of bytes of [ptr, ptr + bytes) that differ from the pattern to the 64-bit
// counter at device address `counter` (asynchronously, on `stream`).
Status count_mismatches(std::uintptr_t ptr, std::size_t bytes, std::uint32_t seed,
                        std::uintptr_t stream, std::uintptr_t counter,
                        std::uint64_t first_offset = 0);

// Keeps one GPU thread busy for `nanoseconds` on `stream`, delaying everything queued after it.
Status spin(std::uint64_t nanoseconds, std::uintptr_t stream);

}  // namespace vramledger::gpu_test
