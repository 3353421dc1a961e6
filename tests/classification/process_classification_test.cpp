#include "accounting/classification/process_classification.hpp"

#include <gtest/gtest.h>

#include "scripted_process.hpp"

namespace vramledger {
namespace {

using namespace vramledger::testing;

// 20 MiB segment: a 4 MiB block (4'000'000 requested) live, a 2 MiB block freed but pending on
// another stream, 14 MiB free. NCCL and cuBLAS allocated outside torch; context 600 MiB.
class TypicalProcess : public ScriptedProcess {
 public:
  TypicalProcess()
      : ScriptedProcess(/*device_total=*/140 * kGiB, /*context=*/600 * kMiB,
                        /*neighbours=*/3 * kGiB) {
    ScriptedProcess& p = *this;
    p.create_segment(20 * kMiB);
    p.alloc(4 * kMiB, 4'000'000);
    const DevicePtr pending = p.alloc(2 * kMiB, 2'000'000);
    p.free_pending(pending, 2 * kMiB, 2'000'000);
    p.library_alloc("libnccl.so.2", 96 * kMiB);
    p.library_alloc("libcublasLt.so.12", 32 * kMiB);
  }
};

TEST(ProcessClassification, LinesAreExactAndSumToProcessUsage) {
  TypicalProcess p;
  const ProcessClassification c = classify_process({DeviceLedgerView::of(p.ledger)}, p.tracked,
                                                   p.nvml.sample());
  EXPECT_EQ(c.basis, ProcessUsageBasis::kNvmlPerProcess);
  EXPECT_EQ(c.process_usage, 600 * kMiB + 20 * kMiB + 128 * kMiB);
  EXPECT_EQ(c.torch.requested, 4'000'000);
  EXPECT_EQ(c.torch.rounding, 4 * kMiB - 4'000'000);
  EXPECT_EQ(c.torch.pending_frees, 2 * kMiB);
  EXPECT_EQ(c.torch.cached_usable, 14 * kMiB);
  EXPECT_EQ(c.torch.fragmentation, 0);
  EXPECT_EQ(c.torch.unmapped_physical, 0);
  EXPECT_EQ(c.torch.reserved, 20 * kMiB);
  ASSERT_EQ(c.non_torch_by_library.size(), 2u);
  EXPECT_EQ(c.non_torch_by_library[0], (NamedBytes{"libcublasLt.so.12", 32 * kMiB}));
  EXPECT_EQ(c.non_torch_by_library[1], (NamedBytes{"libnccl.so.2", 96 * kMiB}));
  EXPECT_EQ(c.remainder, 600 * kMiB);
  EXPECT_EQ(c.remainder_label(), "context, modules, driver");
  EXPECT_EQ(c.sum(), c.process_usage);
  EXPECT_TRUE(c.all_lines_non_negative());
  EXPECT_TRUE(c.trustworthy());
  ASSERT_TRUE(c.other_processes.has_value());
  EXPECT_EQ(*c.other_processes, 3 * kGiB);
  EXPECT_EQ(c.non_torch_bytes(), 600 * kMiB + 128 * kMiB);
  std::int64_t listed = 0;
  for (const NamedBytes& line : c.lines()) listed += line.bytes;
  EXPECT_EQ(listed, c.process_usage);
}

// Sleep by tag (docs/sleep.md): a sleeping block leaves the torch lines but for its bytes on
// pages kept mapped for neighbours, which are a line of their own; the lines still sum to NVML.
TEST(ProcessClassification, SleepingBytesOnKeptPagesAreTheirOwnLine) {
  TypicalProcess p;
  const DevicePtr weights = p.alloc(6 * kMiB, 6 * kMiB, /*tag=*/1);
  p.ledger.on_event({.kind = EventKind::kSleep, .tag = 1, .stream = 1, .address = weights,
                     .size = 6 * kMiB, .requested = 6 * kMiB});
  p.ledger.on_event({.kind = EventKind::kSleepResident, .tag = 1, .stream = 1, .address = weights,
                     .size = 2 * kMiB});
  const ProcessClassification c = classify_process({DeviceLedgerView::of(p.ledger)}, p.tracked,
                                                   p.nvml.sample());
  EXPECT_EQ(c.torch.requested, 4'000'000) << "the sleeping block is not live";
  EXPECT_EQ(c.torch.sleeping_resident, 2 * kMiB);
  EXPECT_EQ(c.torch.sleeping, 6 * kMiB);
  EXPECT_EQ(c.torch.cached_usable, 20 * kMiB - 4 * kMiB - 2 * kMiB - 2 * kMiB);
  EXPECT_EQ(c.sum(), c.process_usage);
  EXPECT_TRUE(c.all_lines_non_negative());
  bool listed = false;
  std::int64_t total = 0;
  for (const NamedBytes& line : c.lines()) {
    total += line.bytes;
    listed |= line == NamedBytes{"torch asleep, kept pages", 2 * kMiB};
  }
  EXPECT_TRUE(listed);
  EXPECT_EQ(total, c.process_usage);
}

TEST(ProcessClassification, WithoutTrackerNonTorchIsInTheRemainder) {
  TypicalProcess p;
  const ProcessClassification c = classify_process(
      {DeviceLedgerView::of(p.ledger)}, NonTorchTracked::untracked(), p.nvml.sample());
  EXPECT_FALSE(c.non_torch_hooked);
  EXPECT_TRUE(c.non_torch_by_library.empty());
  EXPECT_EQ(c.remainder, 600 * kMiB + 128 * kMiB);
  EXPECT_EQ(c.remainder_label(), "context, modules, driver + untracked non-torch");
  EXPECT_EQ(c.sum(), c.process_usage);
  EXPECT_TRUE(c.all_lines_non_negative());
}

TEST(ProcessClassification, HookedTrackerThatSawNothingHasNoLibraryLines) {
  ScriptedProcess p(8 * kGiB, 500 * kMiB, 0);
  p.create_segment(2 * kMiB);
  const ProcessClassification c = classify_process({DeviceLedgerView::of(p.ledger)},
                                                   NonTorchTracked{.hooked = true, .bytes_by_library = {}},
                                                   p.nvml.sample());
  EXPECT_TRUE(c.non_torch_hooked);
  EXPECT_TRUE(c.non_torch_by_library.empty());
  EXPECT_EQ(c.remainder, 500 * kMiB);
  EXPECT_EQ(c.remainder_label(), "context, modules, driver");
}

TEST(ProcessClassification, NegativeRemainderIsAMissingHookNotClamped) {
  TypicalProcess p;
  ProcessMemory stale = p.nvml.sample();
  // The driver reports less than our lines (148 MiB): e.g. the tracked libraries freed through
  // a path the shim does not hook, so the tracker still counts bytes the driver no longer holds.
  *stale.process_used_bytes = 100 * kMiB;
  const ProcessClassification c = classify_process({DeviceLedgerView::of(p.ledger)}, p.tracked,
                                                   stale);
  EXPECT_EQ(c.remainder, -48 * kMiB);
  ASSERT_TRUE(c.missing_hook.has_value());
  EXPECT_EQ(c.missing_hook->deficit_bytes, 48 * kMiB);
  EXPECT_NE(c.missing_hook->message.find("MISSING HOOK"), std::string::npos);
  EXPECT_NE(c.missing_hook->message.find(std::to_string(48 * kMiB)), std::string::npos);
  EXPECT_FALSE(c.all_lines_non_negative());
  EXPECT_FALSE(c.trustworthy());
  EXPECT_EQ(c.sum(), c.process_usage);  // still exact: nothing was clamped
}

TEST(ProcessClassification, FallbackWithoutPerProcessDataStatesItsCaveat) {
  TypicalProcess p;
  p.nvml.make_process_usage_unavailable("PID namespace not visible to NVML");
  const ProcessClassification c = classify_process({DeviceLedgerView::of(p.ledger)}, p.tracked,
                                                   p.nvml.sample());
  EXPECT_EQ(c.basis, ProcessUsageBasis::kDeviceUsedFallback);
  EXPECT_EQ(c.process_usage, c.device_used);
  EXPECT_FALSE(c.other_processes.has_value());
  EXPECT_NE(c.caveat.find("PID namespace not visible to NVML"), std::string::npos);
  EXPECT_EQ(c.remainder, 600 * kMiB + 3 * kGiB);  // our context and the neighbours, together
  EXPECT_EQ(c.remainder_label(), "context, modules, driver + other processes");
  EXPECT_EQ(c.sum(), c.process_usage);
  EXPECT_TRUE(c.all_lines_non_negative());
}

TEST(ProcessClassification, SeveralAllocatorsAddUp) {
  TypicalProcess main_pool;
  ScriptedProcess graph_pool(140 * kGiB, 0, 0);
  graph_pool.create_segment(64 * kMiB);
  graph_pool.alloc(48 * kMiB, 48 * kMiB - 100);
  ProcessMemory memory = main_pool.nvml.sample();
  *memory.process_used_bytes += 64 * kMiB;  // the driver sees both pools
  memory.device_used_bytes += 64 * kMiB;
  const ProcessClassification c = classify_process(
      {DeviceLedgerView::of(main_pool.ledger), DeviceLedgerView::of(graph_pool.ledger, "graph")},
      main_pool.tracked, memory);
  EXPECT_EQ(c.allocators, 2);
  EXPECT_EQ(c.torch.reserved, 84 * kMiB);
  EXPECT_EQ(c.torch.requested, 4'000'000 + 48 * kMiB - 100);
  EXPECT_EQ(c.torch.cached_usable, 14 * kMiB + 16 * kMiB);
  EXPECT_EQ(c.remainder, 600 * kMiB);
  EXPECT_EQ(c.sum(), c.process_usage);
}

TEST(ProcessClassification, InconsistentLedgerIsAProblemNotHidden) {
  ScriptedProcess p(8 * kGiB, 500 * kMiB, 0);
  p.free(0x1234, 2 * kMiB, 2 * kMiB);  // a free without its allocation
  const ProcessClassification c = classify_process({DeviceLedgerView::of(p.ledger)}, p.tracked,
                                                   p.nvml.sample());
  EXPECT_FALSE(c.problems.empty());
  EXPECT_FALSE(c.trustworthy());
  EXPECT_EQ(c.sum(), c.process_usage);
}

}  // namespace
}  // namespace vramledger
