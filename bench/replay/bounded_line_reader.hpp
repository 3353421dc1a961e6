// Reading text input line by line with bounded memory, from a stream or a gzip file.
//
// std::getline grows its string until it sees a newline: /dev/zero, or a gzip bomb of zeros,
// makes it eat all memory, and when memory runs out inside it the stream only sets badbit, which
// a `while (getline(...))` loop takes for the end of the input. These readers instead refuse a
// line longer than a limit, report read errors as errors, and (gzip) refuse data that expands
// more than a real text trace can, before the bomb is inflated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <istream>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

namespace vramledger {

// A read failure or a limit hit by a ByteSource; the message says which.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bytes in order; read() returns 0 only at the end and throws InputError on failure.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual std::size_t read(char* buffer, std::size_t capacity) = 0;
};

// Over a std::istream; a stream that goes bad (I/O error, or memory exhausted inside the stream)
// is an error, not the end.
class IstreamByteSource : public ByteSource {
 public:
  explicit IstreamByteSource(std::istream& in) : in_(in) {}
  std::size_t read(char* buffer, std::size_t capacity) override;

 private:
  std::istream& in_;
};

// A gzip file (or a plain one: zlib reads those transparently), decompressed as it is read.
// Throws InputError when the file cannot be opened, when the data is corrupt or truncated, or
// when more than `max_expansion` bytes come out per compressed byte (after the first MiB).
// Without zlib at build time, construction throws InputError saying so.
class GzipByteSource : public ByteSource {
 public:
  static constexpr std::uint64_t kDefaultMaxExpansion = 100;

  explicit GzipByteSource(const std::string& path,
                          std::uint64_t max_expansion = kDefaultMaxExpansion);
  ~GzipByteSource() override;
  GzipByteSource(const GzipByteSource&) = delete;
  GzipByteSource& operator=(const GzipByteSource&) = delete;
  std::size_t read(char* buffer, std::size_t capacity) override;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Splits a ByteSource into lines ('\n'; a trailing '\r' is kept for the caller to judge).
class BoundedLineReader {
 public:
  enum class Status : std::uint8_t { kLine, kEnd, kTooLong };

  BoundedLineReader(ByteSource& source, std::size_t max_line_bytes);
  // kLine: `line` holds the next line, valid until the next call. kEnd: no more input.
  // kTooLong: the line has more than max_line_bytes bytes (reading should stop).
  Status next(std::string_view& line);
  std::uint64_t bytes_read() const noexcept { return bytes_read_; }

 private:
  bool refill();

  ByteSource& source_;
  std::size_t max_line_bytes_;
  std::string buffer_;     // unread bytes live in [begin_, end_)
  std::size_t begin_ = 0;
  std::size_t end_ = 0;
  bool at_end_ = false;
  std::uint64_t bytes_read_ = 0;
};

}  // namespace vramledger
