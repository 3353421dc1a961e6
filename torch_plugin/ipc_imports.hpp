// Memory this process maps from other processes through CUDA IPC (torch's getIpcDevPtr), and its
// books: the *imported* figures of docs/stats.md.
//
// One mapping per handle and device, shared by every tensor rebuilt from it (a cudaMalloc handle
// can be opened once per process, and torch sends several storages of one segment with the same
// handle); the mapping is closed when the last of them is gone. Imported memory is not owned:
// the exporting process allocated it and its driver account holds it, so it is no part of this
// process's reserved bytes, nor of the lines that sum to NVML's per-process figure; it is shown
// on a line of its own (docs/ipc.md says what NVML was measured to do).
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "accounting/stat.hpp"
#include "torch_plugin/ipc_driver.hpp"

namespace vramledger::torch_plugin {

struct ImportedFigures {
  Stat bytes;     // mapped imported bytes (whole exported segments, or chunks under a block)
  Stat mappings;  // open mappings (handles)
  std::int64_t close_failures = 0;  // closes the driver refused (counted closed: see .cpp)
  friend bool operator==(const ImportedFigures&, const ImportedFigures&) = default;
};

class ImportedMemory {
 public:
  // `driver` must outlive every mapping handed out.
  explicit ImportedMemory(IpcDriver& driver) : driver_(driver) {}
  ImportedMemory(const ImportedMemory&) = delete;
  ImportedMemory& operator=(const ImportedMemory&) = delete;

  // The mapping of `handle` (either kind) on `device`: opened on first use, shared while any
  // copy of the returned pointer lives, closed with the last. Throws Error with the driver's
  // reason when it cannot be opened (nothing is counted then).
  std::shared_ptr<void> open(int device, const IpcHandle& handle);

  ImportedFigures figures(int device) const;
  void reset_peaks(int device);

 private:
  struct Mapping {
    std::weak_ptr<void> users;
    DevicePtr base = 0;
    std::size_t bytes = 0;
    std::uint64_t generation = 0;
  };
  using Key = std::pair<int, std::string>;

  // With mutex_ held: unmaps and uncounts `it`.
  void close_locked(std::map<Key, Mapping>::iterator it);
  void release(const Key& key, std::uint64_t generation) noexcept;

  IpcDriver& driver_;
  mutable std::mutex mutex_;
  std::map<Key, Mapping> mappings_;
  std::map<int, ImportedFigures> figures_;
  std::uint64_t next_generation_ = 1;
};

}  // namespace vramledger::torch_plugin
