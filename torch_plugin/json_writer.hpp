// A small streaming JSON writer for the plugin's C API (stats and process reports). The plugin
// builds on machines with nothing but torch and CUDA (the GPU machine has no package registry),
// so it cannot use the JSON library the reports layer uses; this stays minimal on purpose.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

namespace vramledger::torch_plugin {

inline void append_json_string(std::string& out, std::string_view text) {
  out += '"';
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
      out += escaped;
    } else {
      out += c;
    }
  }
  out += '"';
}

// An object ('{') or array ('['), closed when it goes out of scope; commas handled here.
class JsonWriter {
 public:
  explicit JsonWriter(std::string& out, char open = '{')
      : out_(out), close_(open == '{' ? '}' : ']') {
    out_ += open;
  }
  ~JsonWriter() { out_ += close_; }
  JsonWriter(const JsonWriter&) = delete;
  JsonWriter& operator=(const JsonWriter&) = delete;

  // Starts a member of an object: writes the key; the caller appends the value.
  std::string& key(std::string_view name) {
    comma();
    append_json_string(out_, name);
    out_ += ':';
    return out_;
  }
  // Starts an element of an array; the caller appends the value.
  std::string& item() {
    comma();
    return out_;
  }
  void number(std::string_view name, std::int64_t value) { key(name) += std::to_string(value); }
  void real(std::string_view name, const std::optional<double>& value) {
    std::string& out = key(name);
    if (!value) {
      out += "null";
      return;
    }
    char text[32];
    std::snprintf(text, sizeof text, "%.6g", *value);
    out += text;
  }
  void boolean(std::string_view name, bool value) { key(name) += value ? "true" : "false"; }
  void string(std::string_view name, std::string_view value) {
    append_json_string(key(name), value);
  }
  void null(std::string_view name) { key(name) += "null"; }

 private:
  void comma() {
    if (!first_) out_ += ',';
    first_ = false;
  }
  std::string& out_;
  char close_;
  bool first_ = true;
};

}  // namespace vramledger::torch_plugin
