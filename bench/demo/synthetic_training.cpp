#include "bench/demo/synthetic_training.hpp"

#include <algorithm>
#include <random>
#include <sstream>
#include <utility>
#include <vector>

namespace vramledger {
namespace {

constexpr std::size_t kBf16 = 2;
constexpr std::size_t kFp32 = 4;
constexpr std::uint32_t kMainStream = 0;
constexpr std::uint32_t kCopyStream = 1;

// Writes trace records and hands out allocation ids.
class TraceWriter {
 public:
  TraceWriter() {
    out_ << "# vramledger workload trace v1\n"
         << "# source: vramledger-demo synthetic GPT-style training loop\n"
         << "s " << kMainStream << " 0\n"
         << "s " << kCopyStream << " 1\n";
  }
  std::uint64_t alloc(std::size_t bytes, std::uint32_t stream = kMainStream) {
    const std::uint64_t id = next_id_++;
    out_ << "a " << id << ' ' << bytes << ' ' << stream << '\n';
    return id;
  }
  void free(std::uint64_t id) { out_ << "f " << id << '\n'; }
  // Freed by the program while another stream still uses it; completed later.
  void free_requested(std::uint64_t id) { out_ << "r " << id << '\n'; }
  void free_completed(std::uint64_t id) { out_ << "c " << id << '\n'; }
  std::string text() const { return out_.str(); }

 private:
  std::ostringstream out_;
  std::uint64_t next_id_ = 1;
};

struct Parameter {
  std::size_t elements = 0;
  std::uint64_t weight = 0;
  std::uint64_t grad = 0;  // 0 while no gradient exists
  std::uint64_t adam_m = 0, adam_v = 0;
};

}  // namespace

std::string synthetic_training_trace(const SyntheticTrainingOptions& o) {
  TraceWriter trace;
  std::mt19937_64 rng(o.seed);
  const std::size_t h = o.hidden;

  // Parameters, allocated once: embedding, then per layer the attention and MLP matrices and
  // the two layer norms (weight + bias each), then the final norm.
  std::vector<Parameter> embedding_and_head;
  std::vector<std::vector<Parameter>> layer_params(o.layers);
  auto make_param = [&](std::size_t elements) {
    return Parameter{elements, trace.alloc(elements * kBf16), 0, 0, 0};
  };
  embedding_and_head.push_back(make_param(o.vocab * h));
  for (auto& params : layer_params) {
    for (std::size_t elements : {3 * h * h, 3 * h, h * h, h, 4 * h * h, 4 * h, 4 * h * h, h,
                                 2 * h, 2 * h}) {
      params.push_back(make_param(elements));
    }
  }
  embedding_and_head.push_back(make_param(2 * h));

  std::uint64_t pending_input = 0;  // input batch of the previous step, still read by the model
  for (int step = 0; step < o.steps; ++step) {
    const std::size_t batch = std::uniform_int_distribution<std::size_t>(o.min_batch, o.max_batch)(rng);
    const std::size_t seq =
        std::uniform_int_distribution<std::size_t>(o.min_sequence, o.max_sequence)(rng);
    const std::size_t tokens = batch * seq;
    const std::size_t act = tokens * h * kBf16;  // one [tokens, hidden] bf16 activation

    // Inputs and labels arrive on the copy stream; the previous step's copy is done by now.
    if (pending_input != 0) trace.free_completed(pending_input);
    const std::uint64_t input = trace.alloc(tokens * 8, kCopyStream);
    const std::uint64_t labels = trace.alloc(tokens * 8, kCopyStream);

    // Forward: each layer saves what its backward needs; temporaries die at once.
    std::uint64_t hidden = trace.alloc(act);  // embedding output
    std::vector<std::vector<std::uint64_t>> saved(o.layers);
    for (int l = 0; l < o.layers; ++l) {
      auto& s = saved[l];
      s.push_back(hidden);                                   // layer input (residual)
      s.push_back(trace.alloc(act));                         // ln1 output
      s.push_back(trace.alloc(3 * act));                     // qkv
      s.push_back(trace.alloc(batch * o.heads * seq * kFp32));  // softmax log-sum-exp
      const std::uint64_t workspace = trace.alloc(act);      // attention kernel workspace
      trace.free(workspace);
      s.push_back(trace.alloc(act));                         // attention output
      s.push_back(trace.alloc(act));                         // ln2 output
      s.push_back(trace.alloc(4 * act));                     // fc1 output
      s.push_back(trace.alloc(4 * act));                     // gelu output
      hidden = trace.alloc(act);                             // layer output
    }
    const std::uint64_t final_norm = trace.alloc(act);
    trace.free_requested(input);  // the program dropped it; the copy stream may still touch it
    pending_input = input;

    // Loss: bf16 logits, an fp32 copy for a stable softmax, the scalar loss.
    const std::uint64_t logits = trace.alloc(tokens * o.vocab * kBf16);
    const std::uint64_t logits_fp32 = trace.alloc(tokens * o.vocab * kFp32);
    const std::uint64_t loss = trace.alloc(kFp32);
    trace.free(logits_fp32);
    trace.free(labels);

    // Backward, last layer first: gradient temporaries, parameter gradients (created on first
    // use each step: zero_grad(set_to_none=True) dropped them), saved activations released.
    std::uint64_t grad_logits = trace.alloc(tokens * o.vocab * kBf16);
    trace.free(logits);
    std::uint64_t grad_hidden = trace.alloc(act);
    trace.free(grad_logits);
    trace.free(final_norm);
    trace.free(hidden);
    for (auto& p : embedding_and_head) {
      if (p.grad == 0) p.grad = trace.alloc(p.elements * kBf16);
    }
    for (int l = o.layers - 1; l >= 0; --l) {
      const std::uint64_t grad_fc = trace.alloc(4 * act);
      for (auto& p : layer_params[l]) {
        if (p.grad == 0) p.grad = trace.alloc(p.elements * kBf16);
      }
      const std::uint64_t grad_qkv = trace.alloc(3 * act);
      trace.free(grad_fc);
      const std::uint64_t grad_in = trace.alloc(act);
      trace.free(grad_qkv);
      trace.free(grad_hidden);
      grad_hidden = grad_in;
      for (std::uint64_t id : saved[l]) trace.free(id);  // including the layer's input
    }
    trace.free(grad_hidden);
    trace.free(loss);

    // Optimizer: AdamW state appears at the first step and stays; a foreach temporary per layer.
    auto adam = [&](Parameter& p) {
      if (p.adam_m == 0) {
        p.adam_m = trace.alloc(p.elements * kFp32);
        p.adam_v = trace.alloc(p.elements * kFp32);
      }
    };
    for (auto& p : embedding_and_head) adam(p);
    for (auto& params : layer_params) {
      std::size_t largest = 0;
      for (auto& p : params) {
        adam(p);
        largest = std::max(largest, p.elements);
      }
      const std::uint64_t temp = trace.alloc(largest * kFp32);
      trace.free(temp);
    }
    // zero_grad(set_to_none=True).
    for (auto& p : embedding_and_head) trace.free(std::exchange(p.grad, 0));
    for (auto& params : layer_params) {
      for (auto& p : params) trace.free(std::exchange(p.grad, 0));
    }
  }
  if (pending_input != 0) trace.free_completed(pending_input);
  // Weights and optimizer state stay allocated: the program ends with them.
  return trace.text();
}

}  // namespace vramledger
