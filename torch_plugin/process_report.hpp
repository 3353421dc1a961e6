// The process classification (accounting/classification, docs/classification.md) of one device,
// assembled from what the plugin holds and what the process can see at call time:
//
//   torch lines      the device's ledger (private pools report to the same ledger)
//   non-torch lines  the LD_PRELOAD shim, found with dlsym(RTLD_DEFAULT) when it is loaded (no
//                    link dependency); absent: hooked = false
//   process usage    NVML's per-process figure (NvmlProcessMemory through
//                    ProbeProcessMemorySource); without NVML, the backend's device-wide figure
//                    (cudaMemGetInfo, or the simulated device's) and the documented fallback
//
// and written as text or as JSON (docs/report_schema.md, "Process report"). The C entry point is
// vramledger_process_report (vramledger_c_api.h).
#pragma once

#include <string>
#include <vector>

#include "accounting/classification/non_torch_tracked.hpp"
#include "accounting/classification/process_classification.hpp"
#include "accounting/classification/process_memory.hpp"
#include "abi/vramledger_preload.h"

namespace vramledger::torch_plugin {

class DeviceAllocators;

struct ProcessReport {
  int device = 0;
  ProcessClassification classification;
  std::string process_memory_source;  // "nvml", "backend_memory_info", "caller" or "none"
  std::string non_torch_source;       // "preload" or "none"
  // Memory mapped from other processes (CUDA IPC, docs/ipc.md): a line apart, never in the sum.
  std::int64_t imported_bytes = 0;
  std::int64_t imported_mappings = 0;
  // Context that is not a problem of the figures themselves (where a figure came from, what a
  // source could not do); never part of the sum.
  std::vector<std::string> notes;
};

// The shim's figures as per-library lines. Every category but vramledger (its calls are the
// ledger's reserved bytes) becomes a line when its current bytes are non-zero; "torch" there is
// memory torch's own code allocated outside vramledger (e.g. its native allocator before
// install). Overflowed / untracked records and unwrapped lookups are added to *notes.
NonTorchTracked non_torch_from_preload(const vramledger_preload_stats& stats,
                                       const char* (*category_name)(int),
                                       std::vector<std::string>* notes);

// The shim's figures when libvramledger_preload.so is loaded in this process (looked up at call
// time), else NonTorchTracked::untracked(). *source becomes "preload" or "none".
NonTorchTracked sample_preload_shim(std::vector<std::string>* notes, std::string* source);

// Assembles the report of `device`. `state` may be null (vramledger never used the device: no
// torch lines). `process_source` replaces NVML and the backend fallback when given (tests, or an
// integration sampling NVML itself); its figures are then labelled "caller".
ProcessReport gather_process_report(int device, DeviceAllocators* state,
                                    ProcessMemorySource* process_source = nullptr);
// The same with the non-torch figures given (tests).
ProcessReport gather_process_report(int device, DeviceAllocators* state,
                                    ProcessMemorySource* process_source,
                                    const NonTorchTracked& non_torch,
                                    std::string non_torch_source);

// Text: one line per classified line with its exact bytes, "= process usage", other processes
// apart, then MISSING HOOK / PROBLEM / CAVEAT / NOTE lines.
std::string process_report_text(const ProcessReport& report);
// JSON: docs/report_schema.md, "Process report (JSON)".
std::string process_report_json(const ProcessReport& report);

inline constexpr int kProcessReportSchemaVersion = 1;

}  // namespace vramledger::torch_plugin
