// A synthetic but realistic allocation pattern: the tensors a PyTorch training loop of a GPT-style
// transformer allocates and frees, step by step, written as a workload trace
// (docs/workload_trace_format.md) so that any replayer or policy can consume it.
//
// What makes it realistic (and hard for an allocator): weights and optimizer state that live for
// the whole run; activations saved layer by layer in the forward pass and freed in reverse in the
// backward pass; short-lived temporaries between them; gradients that appear during backward and
// go away at zero_grad; batch size and sequence length that change every step, so yesterday's
// cached blocks never quite fit; inputs copied on a side stream and freed while the main stream
// still uses them (a delayed free, like record_stream).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace vramledger {

struct SyntheticTrainingOptions {
  int layers = 12;
  std::size_t hidden = 1024;
  std::size_t heads = 16;
  std::size_t vocab = 50304;
  int steps = 40;
  // Per-step batch size and sequence length are drawn uniformly from these ranges.
  std::size_t min_batch = 4, max_batch = 16;
  std::size_t min_sequence = 128, max_sequence = 1024;
  std::uint64_t seed = 1;
};

// The whole trace as text, first line "# vramledger workload trace v1".
std::string synthetic_training_trace(const SyntheticTrainingOptions& options);

}  // namespace vramledger
