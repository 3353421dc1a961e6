// CUDA IPC without a GPU (docs/ipc.md): the handle bytes torch carries between processes, the
// books of imported memory over a scripted driver (one mapping per handle, closed with its last
// user, figures exact at every step, failures count nothing), and the plugin's export and import
// on the simulated device (refusals with their reasons, the offset inside the segment, imported
// bytes in the stats and in the process report apart from the sum). The two-process runs on a
// GPU are tests/torch/test_ipc.py.
#include <gtest/gtest.h>

#include <c10/util/Exception.h>

#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "abi/vramledger_c_api.h"
#include "allocator/errors.hpp"
#include "torch_plugin/cuda_ipc.hpp"
#include "torch_plugin/ipc_handle.hpp"
#include "torch_plugin/ipc_imports.hpp"
#include "torch_plugin/vramledger_allocator.hpp"

namespace vramledger::torch_plugin {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

std::string raw_handle(char fill) { return std::string(kCudaIpcHandleBytes, fill); }

ErrorCode decode_error(std::string_view wire) {
  try {
    decode_ipc_handle(wire);
  } catch (const Error& error) {
    return error.code();
  }
  return ErrorCode::kOk;
}

TEST(IpcHandle, TorchLayoutRoundTripsAndBadBytesAreRefused) {
  const std::string wire = encode_cuda_malloc_handle(raw_handle('h'));
  ASSERT_EQ(wire.size(), 2 + kCudaIpcHandleBytes);
  EXPECT_EQ(wire[0], 2) << "torch's SHAREABLE_HANDLE_VERSION";
  EXPECT_EQ(wire[1], 'c') << "torch's SHAREABLE_CUDA_MALLOC";
  const IpcHandle decoded = decode_ipc_handle(wire);
  EXPECT_EQ(decoded.kind, IpcHandleKind::kCudaMalloc);
  EXPECT_EQ(decoded.payload, raw_handle('h'));
  // A bare cudaIpcMemHandle_t (torch before the version byte) is a cudaMalloc handle.
  EXPECT_EQ(decode_ipc_handle(raw_handle('o')).payload, raw_handle('o'));

  EXPECT_THROW(encode_cuda_malloc_handle("short"), Error);
  EXPECT_EQ(decode_error(""), ErrorCode::kInvalidArgument);
  EXPECT_EQ(decode_error("x"), ErrorCode::kInvalidArgument);
  EXPECT_EQ(decode_error(std::string("\x03" "c") + raw_handle('h')), ErrorCode::kInvalidArgument)
      << "a newer version";
  EXPECT_EQ(decode_error(std::string("\x02" "c") + "abc"), ErrorCode::kInvalidArgument);
  EXPECT_EQ(decode_error(std::string("\x02" "z") + raw_handle('h')),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(decode_error(std::string("\x02" "e") + "expandable segment bytes"),
            ErrorCode::kNotSupported);
  try {
    decode_ipc_handle(std::string("\x02" "e") + "x");
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("expandable_segments"), std::string::npos);
  }
}

// A driver that records every call; sizes by handle, failures on demand.
class ScriptedDriver final : public IpcDriver {
 public:
  Status export_allocation(int, DevicePtr base, std::size_t, std::string* handle) override {
    *handle = raw_handle(static_cast<char>(base));
    return Status::ok();
  }
  Status open(int device, const std::string& handle, DevicePtr* base,
              std::size_t* bytes) override {
    ++opens;
    if (fail_open) return {ErrorCode::kDriverError, "cudaIpcOpenMemHandle: scripted failure"};
    *base = next_base;
    next_base += 64 * kMiB;
    *bytes = sizes.at(handle);
    open_now[*base] = device;
    return Status::ok();
  }
  Status close(int, DevicePtr base) override {
    ++closes;
    if (open_now.erase(base) != 1) return {ErrorCode::kInvalidPointer, "closed twice"};
    if (fail_close) return {ErrorCode::kDriverError, "cudaIpcCloseMemHandle: scripted failure"};
    return Status::ok();
  }

  std::map<std::string, std::size_t> sizes;
  std::map<DevicePtr, int> open_now;
  DevicePtr next_base = 0x700000000000;
  int opens = 0;
  int closes = 0;
  bool fail_open = false;
  bool fail_close = false;
};

TEST(ImportedMemory, OneMappingPerHandleClosedWithItsLastUser) {
  ScriptedDriver driver;
  const std::string a = raw_handle('a');
  const std::string b = raw_handle('b');
  driver.sizes = {{a, 20 * kMiB}, {b, 2 * kMiB}};
  ImportedMemory imports(driver);

  std::shared_ptr<void> first = imports.open(0, a);
  std::shared_ptr<void> second = imports.open(0, a);  // another storage of the same segment
  EXPECT_EQ(first.get(), second.get());
  EXPECT_EQ(driver.opens, 1);
  EXPECT_EQ(imports.figures(0).bytes.current, static_cast<std::int64_t>(20 * kMiB));
  EXPECT_EQ(imports.figures(0).mappings.current, 1);

  std::shared_ptr<void> other = imports.open(0, b);
  std::shared_ptr<void> elsewhere = imports.open(1, a);  // the same handle on another device
  EXPECT_EQ(driver.opens, 3);
  EXPECT_EQ(imports.figures(0).bytes.current, static_cast<std::int64_t>(22 * kMiB));
  EXPECT_EQ(imports.figures(1).bytes.current, static_cast<std::int64_t>(20 * kMiB));

  first.reset();
  EXPECT_EQ(driver.closes, 0) << "second still uses the mapping";
  second.reset();
  EXPECT_EQ(driver.closes, 1);
  EXPECT_EQ(imports.figures(0).bytes.current, static_cast<std::int64_t>(2 * kMiB));
  EXPECT_EQ(imports.figures(0).bytes.peak, static_cast<std::int64_t>(22 * kMiB));
  EXPECT_EQ(imports.figures(0).mappings.current, 1);

  // Opened again after its close: a new mapping, counted again.
  std::shared_ptr<void> again = imports.open(0, a);
  EXPECT_EQ(driver.opens, 4);
  EXPECT_EQ(imports.figures(0).bytes.allocated, static_cast<std::int64_t>(42 * kMiB));
  again.reset();
  other.reset();
  elsewhere.reset();
  EXPECT_EQ(driver.closes, 4);
  EXPECT_TRUE(driver.open_now.empty());
  for (int device : {0, 1}) {
    EXPECT_EQ(imports.figures(device).bytes.current, 0);
    EXPECT_EQ(imports.figures(device).mappings.current, 0);
    EXPECT_EQ(imports.figures(device).close_failures, 0);
  }
  imports.reset_peaks(0);
  EXPECT_EQ(imports.figures(0).bytes.peak, 0);
}

TEST(ImportedMemory, FailuresCountNothingOrAreCounted) {
  ScriptedDriver driver;
  const std::string a = raw_handle('a');
  driver.sizes = {{a, 4 * kMiB}};
  ImportedMemory imports(driver);
  driver.fail_open = true;
  try {
    imports.open(0, a);
    ADD_FAILURE() << "open must fail";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kDriverError);
    EXPECT_NE(std::string(error.what()).find("scripted failure"), std::string::npos);
  }
  EXPECT_EQ(imports.figures(0), ImportedFigures{});
  driver.fail_open = false;
  std::shared_ptr<void> mapping = imports.open(0, a);  // the failed open left nothing behind
  driver.fail_close = true;
  mapping.reset();  // a deleter never throws
  EXPECT_EQ(imports.figures(0).close_failures, 1);
  EXPECT_EQ(imports.figures(0).bytes.current, 0);
}

TEST(ImportedMemory, ManyThreadsShareAndReleaseOneMapping) {
  ScriptedDriver driver;
  const std::string a = raw_handle('a');
  driver.sizes = {{a, 2 * kMiB}};
  ImportedMemory imports(driver);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        std::shared_ptr<void> mapping = imports.open(0, a);
        ASSERT_NE(mapping, nullptr);
        const ImportedFigures figures = imports.figures(0);
        ASSERT_EQ(figures.mappings.current, 1);
        ASSERT_EQ(figures.bytes.current, static_cast<std::int64_t>(2 * kMiB));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(driver.opens, driver.closes);
  EXPECT_TRUE(driver.open_now.empty());
  EXPECT_EQ(imports.figures(0).bytes.current, 0);
  EXPECT_EQ(imports.figures(0).mappings.peak, 1) << "never two mappings of one handle";
}

// --- the plugin on the simulated device ---

VramledgerAllocator& plugin() {
  static VramledgerAllocator& instance = []() -> VramledgerAllocator& {
    setenv("VRAMLEDGER_TORCH_ALLOW_SIMULATED", "1", 1);
    VramledgerAllocator& created = VramledgerAllocator::get_or_create("backend:simulated");
    created.init(1);
    return created;
  }();
  return instance;
}

std::string stats_json() {
  std::string text(1 << 16, '\0');
  text.resize(vramledger_stats_json(0, text.data(), text.size()));
  return text;
}

TEST(PluginIpc, DefaultPoolOnPagesIsRefusedWithTheWayOut) {
  void* p = plugin().malloc(kMiB, 0, nullptr);
  try {
    plugin().shareIpcHandle(p);
    ADD_FAILURE() << "the simulated device's default pool is paged: not exportable yet";
  } catch (const c10::Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("VMM backend"), std::string::npos) << message;
    EXPECT_NE(message.find("backend:cuda_malloc"), std::string::npos) << message;
  }
  plugin().free_block(p);
  EXPECT_THROW(plugin().shareIpcHandle(p), c10::Error) << "no longer live";
  EXPECT_THROW(plugin().shareIpcHandle(reinterpret_cast<void*>(0x1234)), c10::Error);
  try {
    plugin().getIpcDevPtr("x");
    ADD_FAILURE();
  } catch (const c10::Error& error) {
    EXPECT_NE(std::string(error.what()).find("too short"), std::string::npos) << error.what();
  }
}

TEST(PluginIpc, PrivatePoolBlockExportsItsSegmentAndImportsAreBookedApart) {
  const c10::MempoolId_t pool{301, 0};
  const auto me = std::this_thread::get_id();
  plugin().beginAllocateToPool(0, pool, [me](cudaStream_t) {
    return std::this_thread::get_id() == me;
  });
  void* first = plugin().malloc(3 * kMiB, 0, nullptr);
  void* second = plugin().malloc(3 * kMiB, 0, nullptr);  // same 20 MiB segment, further in
  plugin().endAllocateToPool(0, pool);

  const c10_alloc::ShareableHandle a = plugin().shareIpcHandle(first);
  const c10_alloc::ShareableHandle b = plugin().shareIpcHandle(second);
  std::size_t segment_bytes = 0;
  void* base = plugin().getBaseAllocation(second, &segment_bytes);
  EXPECT_EQ(b.offset, static_cast<char*>(second) - static_cast<char*>(base));
  EXPECT_EQ(a.offset, static_cast<char*>(first) - static_cast<char*>(base));
  EXPECT_EQ(a.handle, b.handle) << "one segment, one handle (torch relies on it)";
  EXPECT_EQ(decode_ipc_handle(a.handle).kind, IpcHandleKind::kCudaMalloc);

  const std::int64_t reserved_before =
      plugin().getDeviceStats(0).reserved_bytes[0].current;
  {
    std::shared_ptr<void> mapped = plugin().getIpcDevPtr(a.handle);
    std::shared_ptr<void> again = plugin().getIpcDevPtr(b.handle);
    EXPECT_EQ(mapped.get(), again.get());
    EXPECT_NE(mapped.get(), base) << "mapped at an address of its own, as in another process";
    const ImportedFigures figures = imported_memory().figures(0);
    EXPECT_EQ(figures.bytes.current, static_cast<std::int64_t>(segment_bytes));
    EXPECT_EQ(figures.mappings.current, 1);
    EXPECT_EQ(plugin().getDeviceStats(0).reserved_bytes[0].current, reserved_before)
        << "imported memory is not reserved by this process";
    const std::string stats = stats_json();
    EXPECT_NE(stats.find("\"imported_bytes\":{\"current\":" + std::to_string(segment_bytes)),
              std::string::npos)
        << stats;
    const std::string report = vramledger_process_report(0, "json");
    EXPECT_NE(report.find("\"imported\":{\"bytes\":" + std::to_string(segment_bytes) +
                          ",\"mappings\":1}"),
              std::string::npos)
        << report;
    const std::string text = vramledger_process_report(0, "text");
    EXPECT_NE(text.find("imported from other processes, CUDA IPC (not in the sum)"),
              std::string::npos)
        << text;
  }
  EXPECT_EQ(imported_memory().figures(0).bytes.current, 0);
  EXPECT_EQ(imported_memory().figures(0).mappings.current, 0);
  EXPECT_EQ(std::string(vramledger_process_report(0, "text")).find("imported from"),
            std::string::npos)
      << "no line once nothing is imported";

  plugin().free_block(first);
  plugin().free_block(second);
  plugin().releasePool(0, pool);
  plugin().emptyCache();
}

}  // namespace
}  // namespace vramledger::torch_plugin
