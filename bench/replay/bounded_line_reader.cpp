#include "bench/replay/bounded_line_reader.hpp"

#include <cerrno>
#include <cstring>

#ifdef VRAMLEDGER_HAVE_ZLIB
#include <zlib.h>
#endif

namespace vramledger {

namespace {
constexpr std::size_t kChunkBytes = std::size_t{1} << 16;
// Expansion is judged only past this much output: gzip's fixed overhead makes tiny files look
// like they expand enormously.
constexpr std::uint64_t kExpansionGraceBytes = std::uint64_t{1} << 20;
}  // namespace

std::size_t IstreamByteSource::read(char* buffer, std::size_t capacity) {
  if (in_.bad()) throw InputError("read error (the input stream failed)");
  in_.read(buffer, static_cast<std::streamsize>(capacity));
  const auto got = static_cast<std::size_t>(in_.gcount());
  if (in_.bad()) throw InputError("read error (the input stream failed)");
  return got;
}

#ifdef VRAMLEDGER_HAVE_ZLIB
struct GzipByteSource::State {
  gzFile file = nullptr;
  std::uint64_t max_expansion = 0;
  std::uint64_t bytes_out = 0;
};

GzipByteSource::GzipByteSource(const std::string& path, std::uint64_t max_expansion)
    : state_(std::make_unique<State>()) {
  errno = 0;
  state_->file = gzopen(path.c_str(), "rb");
  if (state_->file == nullptr) {
    throw InputError(std::string("cannot open: ") +
                     (errno != 0 ? std::strerror(errno) : "out of memory"));
  }
  state_->max_expansion = max_expansion;
}

GzipByteSource::~GzipByteSource() {
  if (state_->file != nullptr) gzclose(state_->file);
}

std::size_t GzipByteSource::read(char* buffer, std::size_t capacity) {
  const unsigned want = static_cast<unsigned>(capacity > (1u << 30) ? (1u << 30) : capacity);
  const int got = gzread(state_->file, buffer, want);
  if (got < 0) {
    int code = 0;
    const char* message = gzerror(state_->file, &code);
    throw InputError(std::string("corrupt or truncated gzip data: ") + message);
  }
  if (got == 0) {
    // gzread returns 0 both at a clean end and on a stream cut short; gzerror tells them apart.
    int code = 0;
    const char* message = gzerror(state_->file, &code);
    if (code != Z_OK && code != Z_STREAM_END) {
      throw InputError(std::string("corrupt or truncated gzip data: ") + message);
    }
    return 0;
  }
  state_->bytes_out += static_cast<std::uint64_t>(got);
  const auto bytes_in = static_cast<std::uint64_t>(gzoffset(state_->file));
  if (state_->bytes_out > kExpansionGraceBytes &&
      state_->bytes_out > state_->max_expansion * (bytes_in + 1)) {
    throw InputError("gzip data expands more than " + std::to_string(state_->max_expansion) +
                     "-fold (" + std::to_string(bytes_in) + " compressed bytes gave " +
                     std::to_string(state_->bytes_out) +
                     "): not a workload trace (a gzip bomb?)");
  }
  return static_cast<std::size_t>(got);
}
#else
struct GzipByteSource::State {};
GzipByteSource::GzipByteSource(const std::string&, std::uint64_t) {
  throw InputError("built without zlib: gunzip the trace first");
}
GzipByteSource::~GzipByteSource() = default;
std::size_t GzipByteSource::read(char*, std::size_t) { return 0; }
#endif

BoundedLineReader::BoundedLineReader(ByteSource& source, std::size_t max_line_bytes)
    : source_(source), max_line_bytes_(max_line_bytes) {
  // Room for the longest allowed line with its newline, plus a chunk to read into.
  buffer_.resize(max_line_bytes + 1 + kChunkBytes);
}

bool BoundedLineReader::refill() {
  if (at_end_) return false;
  if (begin_ > 0) {
    std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  const std::size_t got = source_.read(buffer_.data() + end_, buffer_.size() - end_);
  if (got == 0) {
    at_end_ = true;
    return false;
  }
  end_ += got;
  bytes_read_ += got;
  return true;
}

BoundedLineReader::Status BoundedLineReader::next(std::string_view& line) {
  std::size_t searched = begin_;
  for (;;) {
    const void* found = std::memchr(buffer_.data() + searched, '\n', end_ - searched);
    if (found != nullptr) {
      const std::size_t newline = static_cast<std::size_t>(static_cast<const char*>(found) -
                                                           buffer_.data());
      if (newline - begin_ > max_line_bytes_) return Status::kTooLong;
      line = std::string_view(buffer_.data() + begin_, newline - begin_);
      begin_ = newline + 1;
      return Status::kLine;
    }
    if (end_ - begin_ > max_line_bytes_) return Status::kTooLong;
    const std::size_t pending = end_ - begin_;
    if (!refill()) {
      if (begin_ == end_) return Status::kEnd;
      line = std::string_view(buffer_.data() + begin_, end_ - begin_);  // no final newline
      begin_ = end_;
      return Status::kLine;
    }
    searched = begin_ + pending;  // refill moved the pending bytes to the front
  }
}

}  // namespace vramledger
