#include "torch_plugin/ipc_fd_server.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <thread>

namespace vramledger::torch_plugin {
namespace {

constexpr std::uint32_t kMaxRequest = 1 << 16;  // descriptors per request
constexpr std::size_t kBatch = 200;             // per message: below the kernel's SCM_MAX_FD (253)
constexpr int kTimeoutSeconds = 20;

enum Reply : std::uint32_t { kOk = 0, kNotOffered = 1, kBadRequest = 2, kWrongUser = 3 };

socklen_t address_of(std::uint32_t pid, sockaddr_un* address) {
  std::memset(address, 0, sizeof *address);
  address->sun_family = AF_UNIX;
  const std::string name = "vramledger-ipc-" + std::to_string(pid);
  std::memcpy(address->sun_path + 1, name.data(), name.size());  // abstract: leading NUL
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

std::string errno_text(const char* call) {
  return std::string(call) + ": " + std::strerror(errno);
}

bool write_all(int socket, const void* data, std::size_t bytes) {
  const char* at = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t sent = ::send(socket, at, bytes, MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) return false;
    at += sent;
    bytes -= static_cast<std::size_t>(sent);
  }
  return true;
}

bool read_all(int socket, void* data, std::size_t bytes) {
  char* at = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t got = ::recv(socket, at, bytes, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    at += got;
    bytes -= static_cast<std::size_t>(got);
  }
  return true;
}

class Server {
 public:
  Status offer(int fd) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (listener_ < 0) {
      if (Status started = start_locked(); !started.is_ok()) return started;
    }
    offered_.insert(fd);
    return Status::ok();
  }
  void withdraw(int fd) {
    std::lock_guard<std::mutex> lock(mutex_);
    offered_.erase(fd);
  }

 private:
  Status start_locked() {
    const int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listener < 0) return {ErrorCode::kDriverError, errno_text("socket")};
    sockaddr_un address;
    const socklen_t length = address_of(static_cast<std::uint32_t>(::getpid()), &address);
    if (::bind(listener, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
        ::listen(listener, 64) != 0) {
      const std::string why = errno_text("bind/listen on the abstract socket vramledger-ipc-<pid>");
      ::close(listener);
      return {ErrorCode::kDriverError, why};
    }
    listener_ = listener;
    // Never joined: the server lives as long as the process (the plugin is never destroyed).
    std::thread([this, listener] { serve(listener); }).detach();
    return Status::ok();
  }

  void serve(int listener) {
    for (;;) {
      const int client = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;
      }
      answer(client);
      ::close(client);
    }
  }

  void answer(int client) {
    timeval timeout{kTimeoutSeconds, 0};
    ::setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    ::setsockopt(client, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
    ucred peer{};
    socklen_t peer_length = sizeof peer;
    std::uint32_t reply = kOk;
    if (::getsockopt(client, SOL_SOCKET, SO_PEERCRED, &peer, &peer_length) != 0 ||
        peer.uid != ::getuid()) {
      reply = kWrongUser;
    }
    std::uint32_t count = 0;
    if (!read_all(client, &count, sizeof count)) return;
    if (count == 0 || count > kMaxRequest) {
      write_all(client, &(reply = kBadRequest), sizeof reply);
      return;
    }
    std::vector<int> fds(count);
    if (!read_all(client, fds.data(), count * sizeof(int))) return;
    // The lock is held while sending, so a descriptor cannot be withdrawn and closed meanwhile.
    std::lock_guard<std::mutex> lock(mutex_);
    if (reply == kOk) {
      for (int fd : fds) {
        if (offered_.count(fd) == 0) reply = kNotOffered;
      }
    }
    if (!write_all(client, &reply, sizeof reply) || reply != kOk) return;
    for (std::size_t first = 0; first < fds.size(); first += kBatch) {
      const std::size_t n = std::min(kBatch, fds.size() - first);
      char byte = 'f';
      iovec data{&byte, 1};
      std::vector<char> control(CMSG_SPACE(n * sizeof(int)), 0);
      msghdr message{};
      message.msg_iov = &data;
      message.msg_iovlen = 1;
      message.msg_control = control.data();
      message.msg_controllen = control.size();
      cmsghdr* header = CMSG_FIRSTHDR(&message);
      header->cmsg_level = SOL_SOCKET;
      header->cmsg_type = SCM_RIGHTS;
      header->cmsg_len = CMSG_LEN(n * sizeof(int));
      std::memcpy(CMSG_DATA(header), fds.data() + first, n * sizeof(int));
      if (::sendmsg(client, &message, MSG_NOSIGNAL) != 1) return;
    }
  }

  std::mutex mutex_;
  int listener_ = -1;
  std::set<int> offered_;
};

Server& server() {
  static auto* instance = new Server();  // never destroyed: its thread outlives static exit
  return *instance;
}

}  // namespace

Status offer_fd(int fd) { return server().offer(fd); }
void withdraw_fd(int fd) { server().withdraw(fd); }

Status fetch_fds(std::uint32_t pid, const std::vector<int>& fds, std::vector<int>* out) {
  out->clear();
  const int socket = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (socket < 0) return {ErrorCode::kDriverError, errno_text("socket")};
  timeval timeout{kTimeoutSeconds, 0};
  ::setsockopt(socket, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  ::setsockopt(socket, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  sockaddr_un address;
  const socklen_t length = address_of(pid, &address);
  auto fail = [&](ErrorCode code, std::string why) {
    for (int fd : *out) ::close(fd);
    out->clear();
    ::close(socket);
    return Status(code, std::move(why));
  };
  if (::connect(socket, reinterpret_cast<sockaddr*>(&address), length) != 0) {
    return fail(ErrorCode::kInvalidArgument,
                "the exporting process " + std::to_string(pid) +
                    " does not answer (" + errno_text("connect") +
                    "): it has ended, or is in another network namespace");
  }
  const auto count = static_cast<std::uint32_t>(fds.size());
  std::uint32_t reply = kBadRequest;
  if (!write_all(socket, &count, sizeof count) ||
      !write_all(socket, fds.data(), fds.size() * sizeof(int)) ||
      !read_all(socket, &reply, sizeof reply)) {
    return fail(ErrorCode::kDriverError,
                "the exporting process " + std::to_string(pid) + " did not answer in time");
  }
  if (reply != kOk) {
    const char* why = reply == kNotOffered ? "its memory was freed meanwhile"
                      : reply == kWrongUser ? "this process runs as another user"
                                            : "the request was malformed";
    return fail(ErrorCode::kInvalidArgument,
                "the exporting process " + std::to_string(pid) + " refused: " + why);
  }
  while (out->size() < fds.size()) {
    const std::size_t n = std::min(kBatch, fds.size() - out->size());
    char byte = 0;
    iovec data{&byte, 1};
    std::vector<char> control(CMSG_SPACE(n * sizeof(int)), 0);
    msghdr message{};
    message.msg_iov = &data;
    message.msg_iovlen = 1;
    message.msg_control = control.data();
    message.msg_controllen = control.size();
    const ssize_t got = ::recvmsg(socket, &message, MSG_CMSG_CLOEXEC);
    cmsghdr* header = got == 1 ? CMSG_FIRSTHDR(&message) : nullptr;
    if (header == nullptr || header->cmsg_type != SCM_RIGHTS ||
        header->cmsg_len != CMSG_LEN(n * sizeof(int)) || (message.msg_flags & MSG_CTRUNC) != 0) {
      return fail(ErrorCode::kDriverError, "file descriptors from process " +
                                               std::to_string(pid) + " did not arrive whole");
    }
    const std::size_t before = out->size();
    out->resize(before + n);
    std::memcpy(out->data() + before, CMSG_DATA(header), n * sizeof(int));
  }
  ::close(socket);
  return Status::ok();
}

}  // namespace vramledger::torch_plugin
