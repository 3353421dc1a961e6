#include "torch_plugin/install.hpp"

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>

#include <dlfcn.h>

#include <exception>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <string>

#include "torch_plugin/torch_compat.hpp"
#include "torch_plugin/vramledger_allocator.hpp"

namespace vramledger::torch_plugin {

namespace {

namespace c10_alloc = c10::cuda::CUDACachingAllocator;

std::mutex install_mutex;

const char* kHowToInstallEarly =
    "Install vramledger before anything allocates CUDA memory: call vramledger.install() right "
    "after `import torch`, or run the unmodified program as `vramledger run -- python app.py`.";

// Refuses when `current` has handed out or holds any device memory on any device.
void check_unused(c10_alloc::CUDAAllocator* current) {
  if (current == nullptr || !current->initialized()) return;  // torch never set it up
  const std::string name = current->name();
  const int devices = c10::cuda::device_count();
  for (int device = 0; device < devices; ++device) {
    c10::CachingDeviceAllocator::DeviceStats stats;
    try {
      stats = current->getDeviceStats(static_cast<c10::DeviceIndex>(device));
    } catch (const std::exception&) {
      TORCH_CHECK(false, "vramledger: cannot install: the current CUDA allocator '", name,
                  "' is already initialised and cannot say whether it handed out memory. ",
                  kHowToInstallEarly);
    }
    constexpr auto all = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    const bool used = stats.allocation[all].allocated > 0 ||
                      stats.allocation[all].current > 0 ||
                      stats.reserved_bytes[all].current > 0 || stats.num_device_alloc > 0;
    TORCH_CHECK(!used, "vramledger: cannot install: PyTorch's CUDA allocator '", name,
                "' has already allocated memory on device ", device, " (",
                stats.allocation[all].current, " live blocks, ",
                stats.reserved_bytes[all].current, " bytes reserved). ", kHowToInstallEarly);
  }
}

}  // namespace

std::string loaded_torch_version() {
  // libc10.so of a wheel sits in <site-packages>/torch/lib/, beside ../version.py.
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&c10::GetAllocator), &info) == 0 || info.dli_fname == nullptr) {
    return {};
  }
  const auto version_file =
      std::filesystem::path(info.dli_fname).parent_path().parent_path() / "version.py";
  std::ifstream in(version_file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("__version__", 0) != 0) continue;
    const auto open = line.find_first_of("'\"");
    const auto close = open == std::string::npos ? open : line.find(line[open], open + 1);
    if (close == std::string::npos) return {};
    return line.substr(open + 1, close - open - 1);
  }
  return {};
}

void check_loaded_torch_matches_build() {
  const std::string loaded = loaded_torch_version();
  if (loaded.empty()) return;  // not a wheel layout (a source build): nothing to compare with
  const std::string built = std::to_string(compat::kBuiltTorchMajor) + "." +
                            std::to_string(compat::kBuiltTorchMinor);
  // Same major.minor: "2.15" matches "2.15.0+cu130" but not "2.1.0" nor "2.150".
  const bool same = loaded.rfind(built, 0) == 0 &&
                    (loaded.size() == built.size() || loaded[built.size()] == '.' ||
                     loaded[built.size()] == '+');
  if (same) return;
  // Thrown before any call into torch's allocator objects: with another release's vtable layout
  // such a call would land in the wrong method.
  throw std::runtime_error(
      "vramledger: this plugin was built for torch " + built + " but torch " + loaded +
      " is loaded; torch's allocator interface differs between releases. Rebuild vramledger "
      "against the torch you run (pip install --no-build-isolation --force-reinstall vramledger "
      "from its source, in this environment).");
}

void install(std::string_view config_text) {
  check_loaded_torch_matches_build();
  std::lock_guard<std::mutex> lock(install_mutex);
  c10_alloc::CUDAAllocator* current = c10_alloc::allocator.load();
  VramledgerAllocator* ours = VramledgerAllocator::instance();
  if (ours != nullptr && current == ours) {
    TORCH_CHECK(config_text.empty() || config_text == ours->config_text(),
                "vramledger: already installed with config '", ours->config_text(),
                "'; cannot reinstall with '", std::string(config_text), "'");
    return;
  }
  check_unused(current);
  VramledgerAllocator* allocator = nullptr;
  try {
    allocator = &VramledgerAllocator::get_or_create(config_text);
  } catch (const std::exception& error) {
    TORCH_CHECK(false, "vramledger: cannot install: ", error.what());
  }
  // torch calls init() during its lazy CUDA initialisation; if that already happened, it will
  // not call ours, so do it here.
  if (current != nullptr && current->initialized() && !allocator->initialized()) {
    allocator->init(c10::cuda::device_count());
  }
  c10_alloc::allocator.store(allocator);
  // The highest priority: torch 2.15's CUDA library registers its own allocator above the default
  // priority 0 (which torch 2.11 used), and only an equal or higher priority replaces it.
  c10::SetAllocator(c10::DeviceType::CUDA, allocator, std::numeric_limits<std::uint8_t>::max());
  TORCH_CHECK(c10::GetAllocator(c10::DeviceType::CUDA) == allocator,
              "vramledger: installed as the CUDA caching allocator, but c10::SetAllocator(CUDA) "
              "kept another allocator registered with a higher priority");
}

bool installed() {
  VramledgerAllocator* ours = VramledgerAllocator::instance();
  return ours != nullptr && c10_alloc::allocator.load() == ours;
}

}  // namespace vramledger::torch_plugin
