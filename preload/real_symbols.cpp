#include "preload/real_symbols.hpp"

#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cstring>

namespace vramledger::preload {
namespace {

// Versions glibc has given these symbols: 2.34 moved them into libc; 2.2.5 is x86-64's base
// version, 2.17 aarch64's.
constexpr const char* kGlibcVersions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};

void* glibc_symbol(const char* name) {
  for (const char* version : kGlibcVersions) {
    if (void* symbol = dlvsym(RTLD_NEXT, name, version)) return symbol;
  }
  return nullptr;
}

struct NameSearch {
  const char* needle;
  char found[4096];
};

int find_loaded(struct dl_phdr_info* info, size_t, void* data) {
  auto* search = static_cast<NameSearch*>(data);
  if (info->dlpi_name == nullptr || std::strstr(info->dlpi_name, search->needle) == nullptr) return 0;
  const size_t length = std::strlen(info->dlpi_name);
  if (length >= sizeof(search->found)) return 0;
  std::memcpy(search->found, info->dlpi_name, length + 1);
  return 1;
}

// A handle on a loaded library whose path contains `needle`, without loading anything.
void* loaded_library(const char* needle) {
  NameSearch search{needle, {}};
  // Copy the name out first: dlopen must not run under dl_iterate_phdr's lock.
  if (dl_iterate_phdr(find_loaded, &search) == 0) return nullptr;
  return real_dlopen()(search.found, RTLD_LAZY | RTLD_NOLOAD);  // kept: the library stays loaded
}

}  // namespace

DlsymFn real_dlsym() {
  static std::atomic<DlsymFn> cached{nullptr};
  DlsymFn fn = cached.load(std::memory_order_acquire);
  if (fn == nullptr) {
    fn = reinterpret_cast<DlsymFn>(glibc_symbol("dlsym"));
    cached.store(fn, std::memory_order_release);
  }
  return fn;
}

DlopenFn real_dlopen() {
  static std::atomic<DlopenFn> cached{nullptr};
  DlopenFn fn = cached.load(std::memory_order_acquire);
  if (fn == nullptr) {
    fn = reinterpret_cast<DlopenFn>(glibc_symbol("dlopen"));
    cached.store(fn, std::memory_order_release);
  }
  return fn;
}

void* next_definition(Library library, const char* name) {
  if (void* symbol = real_dlsym()(RTLD_NEXT, name)) return symbol;
  static std::atomic<void*> handles[2] = {nullptr, nullptr};
  auto& handle = handles[library == Library::kDriver ? 0 : 1];
  void* h = handle.load(std::memory_order_acquire);
  if (h == nullptr) {
    h = loaded_library(library == Library::kDriver ? "libcuda.so" : "libcudart.so");
    if (h == nullptr) return nullptr;
    handle.store(h, std::memory_order_release);
  }
  return real_dlsym()(h, name);
}

const char* shim_directory() {
  static char directory[4096];
  static std::atomic<bool> done{false};
  if (!done.load(std::memory_order_acquire)) {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&shim_directory), &info) != 0 && info.dli_fname != nullptr) {
      const char* slash = std::strrchr(info.dli_fname, '/');
      const size_t length = slash ? static_cast<size_t>(slash - info.dli_fname) + 1 : 0;
      if (length < sizeof(directory)) {
        std::memcpy(directory, info.dli_fname, length);
        directory[length] = '\0';
      }
    }
    done.store(true, std::memory_order_release);
  }
  return directory;
}

}  // namespace vramledger::preload
