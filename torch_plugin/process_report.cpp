#include "torch_plugin/process_report.hpp"

#include <dlfcn.h>

#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>

#include "accounting/classification/probe_process_memory_source.hpp"
#include "allocator/cuda/nvml_process_memory.hpp"
#include "allocator/text_format.hpp"
#include "torch_plugin/cuda_ipc.hpp"
#include "torch_plugin/device_allocators.hpp"
#include "torch_plugin/json_writer.hpp"
#include "torch_plugin/vramledger_allocator.hpp"

namespace vramledger::torch_plugin {
namespace {

// NVML handles per device, opened once (an open costs an NVML initialisation) and kept for the
// life of the process: never destroyed, so a report written at exit cannot race a shutdown.
NvmlProcessMemory* nvml_for(int device, Status* status) {
  static std::mutex mutex;
  static auto* opened = new std::map<int, NvmlProcessMemory*>();
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = opened->find(device); it != opened->end()) return it->second;
  std::unique_ptr<NvmlProcessMemory> nvml = NvmlProcessMemory::open(device, status);
  if (!nvml) return nullptr;  // not cached: NVML may become usable later (driver loaded)
  NvmlProcessMemory* raw = nvml.release();
  (*opened)[device] = raw;
  return raw;
}

// Process memory without a caller's source: NVML, else the backend's device-wide figures.
ProcessMemory sample_process_memory(int device, DeviceAllocators* state, std::string* source,
                                    std::vector<std::string>* notes) {
  std::string nvml_problem;
  if (state != nullptr && state->is_simulated()) {
    nvml_problem = "simulated device: NVML describes real GPUs only";
  } else {
    Status status;
    if (NvmlProcessMemory* nvml = nvml_for(device, &status)) {
      ProbeProcessMemorySource<NvmlProcessMemory> probe(*nvml);
      *source = "nvml";
      return probe.sample();
    }
    nvml_problem = status.message();
  }
  ProcessMemory memory;
  memory.process_used_unavailable = nvml_problem;
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  const Status info = state != nullptr
                          ? state->backend().memory_info(&free_bytes, &total_bytes)
                          : Status(ErrorCode::kNotSupported, "vramledger never used this device");
  if (info.is_ok()) {
    *source = "backend_memory_info";
    memory.device_total_bytes = static_cast<std::int64_t>(total_bytes);
    memory.device_used_bytes = static_cast<std::int64_t>(total_bytes - free_bytes);
  } else {
    *source = "none";
    notes->push_back("no device memory figure either (" + info.message() +
                     "): process usage is 0 and the remainder is meaningless");
  }
  return memory;
}

void note_count(std::vector<std::string>* notes, std::int64_t count, const std::string& text) {
  if (count != 0) notes->push_back("preload shim: " + std::to_string(count) + " " + text);
}

}  // namespace

NonTorchTracked non_torch_from_preload(const vramledger_preload_stats& stats,
                                       const char* (*category_name)(int),
                                       std::vector<std::string>* notes) {
  NonTorchTracked tracked;
  tracked.hooked = true;
  for (int category = 0; category < VRAMLEDGER_PRELOAD_CATEGORY_COUNT; ++category) {
    if (category == VRAMLEDGER_PRELOAD_VRAMLEDGER) continue;  // the ledger's own bytes
    const std::int64_t bytes = stats.categories[category].current_bytes;
    if (bytes == 0) continue;
    const char* name = category_name != nullptr ? category_name(category) : nullptr;
    std::string library = name != nullptr ? name : "category " + std::to_string(category);
    if (category == VRAMLEDGER_PRELOAD_TORCH) library = "torch (outside vramledger)";
    tracked.bytes_by_library[library] += bytes;
  }
  if (stats.table_overflow != 0) {
    notes->push_back("preload shim: " + std::to_string(stats.table_overflow) +
                     " allocations (" + std::to_string(stats.table_overflow_bytes) +
                     " bytes) not recorded (table full): they are in the remainder");
  }
  note_count(notes, stats.untracked_frees, "frees of memory it never saw allocated");
  note_count(notes, stats.unwrapped_lookups,
             "memory entry points handed out unwrapped: calls through them are not counted");
  return tracked;
}

NonTorchTracked sample_preload_shim(std::vector<std::string>* notes, std::string* source) {
  using GetStats = int (*)(vramledger_preload_stats*);
  using CategoryName = const char* (*)(int);
  // Looked up at every call: the shim is there from process start (LD_PRELOAD) or not at all.
  auto* get_stats =
      reinterpret_cast<GetStats>(dlsym(RTLD_DEFAULT, "vramledger_preload_get_stats"));
  auto* category_name =
      reinterpret_cast<CategoryName>(dlsym(RTLD_DEFAULT, "vramledger_preload_category_name"));
  vramledger_preload_stats stats{};
  if (get_stats == nullptr || get_stats(&stats) != 0) {
    *source = "none";
    return NonTorchTracked::untracked();
  }
  *source = "preload";
  return non_torch_from_preload(stats, category_name, notes);
}

ProcessReport gather_process_report(int device, DeviceAllocators* state,
                                    ProcessMemorySource* process_source) {
  std::vector<std::string> notes;
  std::string non_torch_source;
  NonTorchTracked non_torch = sample_preload_shim(&notes, &non_torch_source);
  // The shim counts the whole process, every device together: per device it is exact only when
  // this is the one device vramledger serves.
  VramledgerAllocator* instance = VramledgerAllocator::instance();
  const std::size_t devices = instance ? instance->created_devices().size() : 0;
  if (non_torch.hooked && devices > 1) {
    notes.push_back("preload shim: its figures (" + std::to_string(non_torch.total()) +
                    " bytes) are for every device together and vramledger serves " +
                    std::to_string(devices) +
                    " devices, so they are left out of this device's lines (they are in the "
                    "remainder)");
    non_torch = NonTorchTracked::untracked();
    non_torch_source = "none (process-wide figures, several devices)";
  }
  ProcessReport report =
      gather_process_report(device, state, process_source, non_torch, non_torch_source);
  report.notes.insert(report.notes.begin(), notes.begin(), notes.end());
  return report;
}

ProcessReport gather_process_report(int device, DeviceAllocators* state,
                                    ProcessMemorySource* process_source,
                                    const NonTorchTracked& non_torch,
                                    std::string non_torch_source) {
  ProcessReport report;
  report.device = device;
  report.non_torch_source = std::move(non_torch_source);
  std::vector<DeviceLedgerView> views;
  if (state != nullptr) views.push_back(state->ledger_view());
  // Memory torch asked for while caching was disabled is outside the ledger; the shim counts it
  // as vramledger's own calls, which it leaves to the ledger: so it gets its own line here.
  NonTorchTracked lines = non_torch;
  if (state != nullptr && lines.hooked && state->uncached_bytes() != 0) {
    lines.bytes_by_library["torch, caching disabled (cudaMalloc)"] += state->uncached_bytes();
  }
  // Ledger first, process figure after: memory freed in between shows as a smaller remainder,
  // memory allocated in between as a larger one; both are stated as sampling skew, not hidden.
  ProcessMemory memory;
  if (process_source != nullptr) {
    memory = process_source->sample();
    report.process_memory_source = "caller";
  } else {
    memory = sample_process_memory(device, state, &report.process_memory_source, &report.notes);
  }
  report.classification = classify_process(views, lines, memory);
  const ImportedFigures imported = imported_memory().figures(device);
  report.imported_bytes = imported.bytes.current;
  report.imported_mappings = imported.mappings.current;
  return report;
}

namespace {

void append_line(std::string& out, std::string_view prefix, std::string_view label,
                 std::int64_t bytes, std::string_view suffix = {}) {
  char text[256];
  std::snprintf(text, sizeof text, "%.*s%-66.*s %20lld  (%s)", static_cast<int>(prefix.size()),
                prefix.data(), static_cast<int>(label.size()), label.data(),
                static_cast<long long>(bytes), format_bytes(bytes).c_str());
  out += text;
  out += suffix;
  out += '\n';
}

}  // namespace

std::string process_report_text(const ProcessReport& report) {
  const ProcessClassification& c = report.classification;
  std::string out = "vramledger process memory, CUDA device " + std::to_string(report.device) +
                    ": process usage basis " + to_string(c.basis) + " (from " +
                    report.process_memory_source + "), non-torch tracking " +
                    (c.non_torch_hooked ? "by the preload shim" : "off (" +
                                                                      report.non_torch_source +
                                                                      ")") +
                    ", " + std::to_string(c.allocators) + " ledger(s)\n";
  for (const NamedBytes& line : c.lines()) append_line(out, "  ", line.name, line.bytes);
  append_line(out, "= ", "process usage", c.process_usage);
  if (c.other_processes) {
    append_line(out, "  ", "other processes (not in the sum)", *c.other_processes);
  } else {
    out += "  other processes (not in the sum): unknown (no per-process figure)\n";
  }
  if (report.imported_mappings != 0) {
    append_line(out, "  ", "imported from other processes, CUDA IPC (not in the sum)",
                report.imported_bytes);
  }
  append_line(out, "  ", "device used (not in the sum)", c.device_used);
  append_line(out, "  ", "device total", c.device_total);
  if (c.missing_hook) out += c.missing_hook->message + '\n';
  for (const std::string& problem : c.problems) out += "PROBLEM: " + problem + '\n';
  if (!c.caveat.empty()) out += "CAVEAT: " + c.caveat + '\n';
  for (const std::string& note : report.notes) out += "NOTE: " + note + '\n';
  return out;
}

std::string process_report_json(const ProcessReport& report) {
  const ProcessClassification& c = report.classification;
  std::string out;
  {
    JsonWriter root(out);
    root.string("schema", "vramledger.process_report");
    root.number("schema_version", kProcessReportSchemaVersion);
    root.number("device", report.device);
    root.string("basis", to_string(c.basis));
    root.string("process_memory_source", report.process_memory_source);
    root.number("allocators", c.allocators);
    {
      JsonWriter lines(root.key("lines"), '[');
      const std::vector<NamedBytes> all = c.lines();
      for (std::size_t i = 0; i < all.size(); ++i) {
        JsonWriter line(lines.item());
        // The torch lines come first (six, a seventh while sleeping pages are kept: sleep.md).
        const bool torch_line = all[i].name.rfind("torch ", 0) == 0;
        const char* kind =
            torch_line ? "torch" : (i + 1 == all.size() ? "remainder" : "non_torch");
        line.string("kind", kind);
        line.string("name", all[i].name);
        line.number("bytes", all[i].bytes);
      }
    }
    {
      JsonWriter torch(root.key("torch"));
      torch.number("requested", c.torch.requested);
      torch.number("rounding", c.torch.rounding);
      torch.number("pending_frees", c.torch.pending_frees);
      torch.number("cached_usable", c.torch.cached_usable);
      torch.number("fragmentation", c.torch.fragmentation);
      torch.number("unmapped_physical", c.torch.unmapped_physical);
      torch.number("sleeping_resident", c.torch.sleeping_resident);  // docs/sleep.md
      torch.number("reserved", c.torch.reserved);
      torch.number("sleeping", c.torch.sleeping);  // address space, not a line
    }
    {
      JsonWriter non_torch(root.key("non_torch"));
      non_torch.boolean("hooked", c.non_torch_hooked);
      non_torch.string("source", report.non_torch_source);
      {
        JsonWriter libraries(non_torch.key("by_library"));
        for (const NamedBytes& library : c.non_torch_by_library) {
          libraries.number(library.name, library.bytes);
        }
      }
      non_torch.number("tracked_total", c.non_torch_tracked_total());
    }
    {
      JsonWriter remainder(root.key("remainder"));
      remainder.string("label", c.remainder_label());
      remainder.number("bytes", c.remainder);
    }
    root.number("process_usage_bytes", c.process_usage);
    root.number("sum_bytes", c.sum());
    root.number("non_torch_bytes", c.non_torch_bytes());
    if (c.other_processes) {
      root.number("other_processes_bytes", *c.other_processes);
    } else {
      root.null("other_processes_bytes");
    }
    {
      JsonWriter imported(root.key("imported"));  // CUDA IPC, docs/ipc.md: not in the sum
      imported.number("bytes", report.imported_bytes);
      imported.number("mappings", report.imported_mappings);
    }
    root.number("device_used_bytes", c.device_used);
    root.number("device_total_bytes", c.device_total);
    root.boolean("all_lines_non_negative", c.all_lines_non_negative());
    root.boolean("trustworthy", c.trustworthy());
    if (c.missing_hook) {
      JsonWriter hook(root.key("missing_hook"));
      hook.number("deficit_bytes", c.missing_hook->deficit_bytes);
      hook.string("message", c.missing_hook->message);
    } else {
      root.null("missing_hook");
    }
    {
      JsonWriter problems(root.key("problems"), '[');
      for (const std::string& problem : c.problems) append_json_string(problems.item(), problem);
    }
    if (c.caveat.empty()) {
      root.null("caveat");
    } else {
      root.string("caveat", c.caveat);
    }
    {
      JsonWriter notes(root.key("notes"), '[');
      for (const std::string& note : report.notes) append_json_string(notes.item(), note);
    }
  }
  return out;
}

}  // namespace vramledger::torch_plugin
