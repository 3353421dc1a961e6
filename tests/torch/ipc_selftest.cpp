// CUDA IPC without a GPU (docs/ipc.md): the handle bytes torch carries between processes (both
// kinds), the exporter's chunk descriptors (one per chunk, closed with the last exported block on
// it), the books of imported memory over a scripted driver (one mapping per handle, closed with
// its last user, figures exact at every step, failures count nothing), and the plugin's export
// and import on the simulated device (a paged block's chunks until it is freed, a private pool's
// segment and offsets, imported bytes in the stats and in the process report apart from the sum,
// refusals with their reasons). The two-process runs on a GPU are tests/torch/test_ipc.py.
#include <gtest/gtest.h>

#include <c10/util/Exception.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "abi/vramledger_c_api.h"
#include "allocator/errors.hpp"
#include "torch_plugin/cuda_ipc.hpp"
#include "torch_plugin/ipc_fd_server.hpp"
#include "torch_plugin/ipc_handle.hpp"
#include "torch_plugin/ipc_imports.hpp"
#include "torch_plugin/vramledger_allocator.hpp"
#include "tests/torch/simulated_plugin.hpp"

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

TEST(IpcHandle, VmmShareRoundTripsAndMalformedOnesAreRefused) {
  VmmShare share;
  share.pid = 4242;
  share.pieces = {{0, 2 * kMiB, 7}, {2 * kMiB, 64 * kMiB, 9}};
  const std::string wire = encode_vmm_share(share);
  EXPECT_EQ(wire[1], 'v');
  const IpcHandle decoded = decode_ipc_handle(wire);
  EXPECT_EQ(decoded.kind, IpcHandleKind::kVmmPages);
  EXPECT_EQ(decode_vmm_share(decoded.payload), share);
  EXPECT_EQ(share.span_bytes(), 66 * kMiB);

  VmmShare gap = share;
  gap.pieces[1].offset += 4096;  // chunks must follow each other
  EXPECT_THROW(encode_vmm_share(gap), Error);
  EXPECT_THROW(encode_vmm_share(VmmShare{}), Error);
  EXPECT_EQ(decode_error(wire.substr(0, wire.size() - 1)), ErrorCode::kInvalidArgument);
  EXPECT_EQ(decode_error(wire.substr(0, 6)), ErrorCode::kInvalidArgument);
}

// The descriptors' way between processes (here the process asks itself: the server thread
// answers over the same abstract socket another process would use).
TEST(IpcFdServer, OfferedDescriptorsArriveAndOthersAreRefused) {
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  int other[2];
  ASSERT_EQ(::pipe(other), 0);
  ASSERT_TRUE(offer_fd(pipe_fds[0]).is_ok());
  ASSERT_TRUE(offer_fd(other[0]).is_ok());
  std::vector<int> received;
  const auto me = static_cast<std::uint32_t>(::getpid());
  ASSERT_TRUE(fetch_fds(me, {pipe_fds[0], other[0]}, &received).is_ok());
  ASSERT_EQ(received.size(), 2u);
  EXPECT_NE(received[0], pipe_fds[0]) << "a copy, not the number";
  ASSERT_EQ(::write(pipe_fds[1], "ipc", 3), 3);
  char text[4] = {};
  ASSERT_EQ(::read(received[0], text, 3), 3) << "the copy reads the same pipe";
  EXPECT_STREQ(text, "ipc");
  for (int fd : received) ::close(fd);

  withdraw_fd(other[0]);
  const Status withdrawn = fetch_fds(me, {pipe_fds[0], other[0]}, &received);
  EXPECT_FALSE(withdrawn.is_ok());
  EXPECT_NE(withdrawn.message().find("freed meanwhile"), std::string::npos) << withdrawn.message();
  EXPECT_TRUE(received.empty()) << "all or nothing";
  const Status nobody = fetch_fds(me + 1000000, {pipe_fds[0]}, &received);
  EXPECT_NE(nobody.message().find("does not answer"), std::string::npos) << nobody.message();

  // More than one message's worth (the server sends 200 per message).
  std::vector<int> many(450, pipe_fds[0]);
  ASSERT_TRUE(fetch_fds(me, many, &received).is_ok());
  EXPECT_EQ(received.size(), many.size());
  for (int fd : received) ::close(fd);
  withdraw_fd(pipe_fds[0]);
  for (int fd : {pipe_fds[0], pipe_fds[1], other[0], other[1]}) ::close(fd);
}

// The same between two processes: a forked child fetches its parent's descriptor and reads what
// the parent wrote into the pipe behind it.
TEST(IpcFdServer, AnotherProcessFetchesTheDescriptor) {
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  ASSERT_TRUE(offer_fd(pipe_fds[0]).is_ok());
  ASSERT_EQ(::write(pipe_fds[1], "from parent", 11), 11);
  const auto parent = static_cast<std::uint32_t>(::getpid());
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // only sockets and reads here: the child of a threaded process
    ::close(pipe_fds[0]);  // its inherited copy: the one it reads must come through the socket
    std::vector<int> received;
    if (!fetch_fds(parent, {pipe_fds[0]}, &received).is_ok() || received.size() != 1) _exit(2);
    char text[12] = {};
    if (::read(received[0], text, 11) != 11 || std::string(text) != "from parent") _exit(3);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  withdraw_fd(pipe_fds[0]);
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
}

IpcHandle malloc_handle(char fill) { return {IpcHandleKind::kCudaMalloc, raw_handle(fill)}; }

// A driver that records every call; sizes by handle, failures on demand.
class ScriptedDriver final : public IpcDriver {
 public:
  Status export_allocation(int, DevicePtr base, std::size_t, std::string* handle) override {
    *handle = raw_handle(static_cast<char>(base));
    return Status::ok();
  }
  Status open(int device, const IpcHandle& handle, DevicePtr* base,
              std::size_t* bytes) override {
    ++opens;
    if (fail_open) return {ErrorCode::kDriverError, "cudaIpcOpenMemHandle: scripted failure"};
    *base = next_base;
    next_base += 64 * kMiB;
    *bytes = sizes.at(handle.payload);
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
  std::set<int> offered;
  DevicePtr next_base = 0x700000000000;
  int opens = 0;
  int closes = 0;
  int next_fd = 3;
  bool fail_open = false;
  bool fail_close = false;
  bool fail_export = false;

 protected:
  Status export_chunk(int, PhysicalHandle, int* fd) override {
    if (fail_export) return {ErrorCode::kDriverError, "cuMemExportToShareableHandle: scripted"};
    *fd = next_fd++;
    offered.insert(*fd);
    return Status::ok();
  }
  void close_chunk(int fd) noexcept override { offered.erase(fd); }
  std::uint32_t process_id() const override { return 77; }
};

TEST(IpcExports, ChunksExportedOnceAndClosedWithTheirLastBlock) {
  ScriptedDriver driver;
  // Block A on chunks 1 and 2, block B on chunks 2 and 3 (they share chunk 2's pages).
  const std::vector<PhysicalPiece> a = {{0x1000000, 2 * kMiB, 1}, {0x1200000, 4 * kMiB, 2}};
  const std::vector<PhysicalPiece> b = {{0x1200000, 4 * kMiB, 2}, {0x1600000, 2 * kMiB, 3}};
  EXPECT_FALSE(driver.has_exports());
  VmmShare share_a;
  ASSERT_TRUE(driver.export_pieces(0, 0x1100000, a, &share_a).is_ok());
  EXPECT_EQ(share_a.pid, 77u);
  ASSERT_EQ(share_a.pieces.size(), 2u);
  EXPECT_EQ(share_a.pieces[1].offset, 2 * kMiB);
  VmmShare again;
  ASSERT_TRUE(driver.export_pieces(0, 0x1100000, a, &again).is_ok());
  EXPECT_EQ(again, share_a) << "sent twice: the same descriptors, so one mapping in a receiver";
  VmmShare share_b;
  ASSERT_TRUE(driver.export_pieces(0, 0x1300000, b, &share_b).is_ok());
  EXPECT_EQ(share_b.pieces[0].fd, share_a.pieces[1].fd) << "chunk 2 exported once";
  EXPECT_EQ(driver.offered.size(), 3u);
  EXPECT_TRUE(driver.has_exports());

  driver.release_block(0x1100000);
  EXPECT_EQ(driver.offered, (std::set<int>{share_b.pieces[0].fd, share_b.pieces[1].fd}))
      << "chunk 1 closed; chunk 2 still under B";
  driver.release_block(0x1100000);  // not exported any more: nothing happens
  driver.release_block(0x1300000);
  EXPECT_TRUE(driver.offered.empty());
  EXPECT_FALSE(driver.has_exports());

  // A failed export leaves nothing behind.
  driver.fail_export = true;
  VmmShare failed;
  EXPECT_FALSE(driver.export_pieces(0, 0x1100000, a, &failed).is_ok());
  EXPECT_FALSE(driver.has_exports());
  EXPECT_TRUE(driver.offered.empty());
}

TEST(ImportedMemory, OneMappingPerHandleClosedWithItsLastUser) {
  ScriptedDriver driver;
  const IpcHandle a = malloc_handle('a');
  const IpcHandle b = malloc_handle('b');
  driver.sizes = {{a.payload, 20 * kMiB}, {b.payload, 2 * kMiB}};
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
  const IpcHandle a = malloc_handle('a');
  driver.sizes = {{a.payload, 4 * kMiB}};
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
  const IpcHandle a = malloc_handle('a');
  driver.sizes = {{a.payload, 2 * kMiB}};
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

std::string stats_json() {
  std::string text(1 << 16, '\0');
  text.resize(vramledger_stats_json(0, text.data(), text.size()));
  return text;
}

TEST(PluginIpc, PagedBlockExportsItsChunksUntilItIsFreed) {
  // The simulated device's default pool is the paged heap: kind 'v'.
  void* p = plugin().malloc(5 * kMiB + 4096, 0, nullptr);
  const c10_alloc::ShareableHandle shared = plugin().shareIpcHandle(p);
  const IpcHandle handle = decode_ipc_handle(shared.handle);
  ASSERT_EQ(handle.kind, IpcHandleKind::kVmmPages);
  const VmmShare share = decode_vmm_share(handle.payload);
  ASSERT_FALSE(share.pieces.empty());
  // The block lies inside the chunks, at the offset torch adds on the receiving side.
  EXPECT_GE(shared.offset, 0);
  EXPECT_LE(static_cast<std::uint64_t>(shared.offset) + 5 * kMiB + 4096, share.span_bytes());
  EXPECT_EQ(plugin().shareIpcHandle(p).handle, shared.handle) << "sent again: same handle";
  EXPECT_EQ(ipc_exported_blocks(), std::vector<DevicePtr>{reinterpret_cast<DevicePtr>(p)});
  {
    std::shared_ptr<void> mapped = plugin().getIpcDevPtr(shared.handle);
    EXPECT_EQ(imported_memory().figures(0).bytes.current,
              static_cast<std::int64_t>(share.span_bytes()));
  }
  EXPECT_EQ(imported_memory().figures(0).bytes.current, 0);
  plugin().free_block(p);
  EXPECT_TRUE(ipc_exported_blocks().empty());
  // Its descriptors were withdrawn with the block: the handle opens no more.
  try {
    plugin().getIpcDevPtr(shared.handle);
    ADD_FAILURE() << "a freed block's chunks must not be offered";
  } catch (const c10::Error& error) {
    EXPECT_NE(std::string(error.what()).find("not offered"), std::string::npos) << error.what();
  }
  EXPECT_EQ(imported_memory().figures(0).bytes.current, 0) << "a failed open counts nothing";
  EXPECT_EQ(imported_memory().figures(0).mappings.current, 0);
}

// A tag whose blocks other processes have mapped must not sleep (the wake would give this
// process new pages the importers never see): refused with nothing changed, allowed again once
// the exported block is freed.
TEST(PluginIpc, ATagWithExportedBlocksDoesNotSleep) {
  ASSERT_EQ(vramledger_tag_push("ipc_shared"), 0);
  void* p = plugin().malloc(3 * kMiB, 0, nullptr);
  void* q = plugin().malloc(3 * kMiB, 0, nullptr);
  vramledger_tag_pop();
  (void)plugin().shareIpcHandle(p);
  vramledger_sleep_result result{};
  EXPECT_EQ(vramledger_sleep(0, "ipc_shared", nullptr, &result), -1);
  const std::string why = vramledger_last_error();
  EXPECT_NE(why.find("cannot sleep tag 'ipc_shared': 1 of its blocks"), std::string::npos) << why;
  EXPECT_NE(why.find("CUDA IPC"), std::string::npos) << why;
  EXPECT_EQ(result.blocks, 0u);
  plugin().free_block(p);
  ASSERT_EQ(vramledger_sleep(0, "ipc_shared", nullptr, &result), 0) << vramledger_last_error();
  EXPECT_EQ(result.blocks, 1u);
  ASSERT_EQ(vramledger_wake(0, "ipc_shared", &result), 0) << vramledger_last_error();
  plugin().free_block(q);
}

TEST(PluginIpc, UnknownPointersAndBadHandlesAreRefused) {
  void* p = plugin().malloc(kMiB, 0, nullptr);
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
