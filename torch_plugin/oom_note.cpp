#include "torch_plugin/oom_note.hpp"

#include <map>
#include <mutex>
#include <utility>

namespace vramledger::torch_plugin {

namespace {

std::mutex& notes_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::map<int, std::string>& notes() {
  static std::map<int, std::string> by_device;
  return by_device;
}

}  // namespace

void set_oom_note(int device, std::string text) {
  const std::lock_guard<std::mutex> lock(notes_mutex());
  if (text.empty()) {
    notes().erase(device);
  } else {
    notes()[device] = std::move(text);
  }
}

std::string oom_note(int device) {
  const std::lock_guard<std::mutex> lock(notes_mutex());
  const auto found = notes().find(device);
  return found == notes().end() ? std::string() : found->second;
}

}  // namespace vramledger::torch_plugin
