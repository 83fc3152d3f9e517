// A fault proxy for the remote-reading tests: listens on 127.0.0.1 (a free port), passes each
// request on to a server on 127.0.0.1 (nginx: testing/nginx_server.h) and hands the answer back
// — or, for the first requests, the fault its schedule names: a 503 with Retry-After, a 403, a
// connection reset halfway through the body, a body cut short, a stall halfway through. One
// request per connection ("Connection: close" both ways). Every wait is bounded (5 s for a
// request or an answer, 20 s for a stall, which ends when the client gives up), and the
// threads are joined when the object goes.
#ifndef LOADSTONE_TESTS_TESTING_FAULT_PROXY_H_
#define LOADSTONE_TESTS_TESTING_FAULT_PROXY_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

namespace loadstone::testing {

enum class Fault {
  kNone,         // the server's answer, whole
  kUnavailable,  // 503 with Retry-After: 0
  kForbidden,    // 403
  kReset,        // the headers and half the body, then a TCP reset
  kTruncate,     // the headers and half the body, then the connection closed
  kStall,        // the headers and half the body, then nothing until the client gives up
};

class FaultProxy {
 public:
  // A proxy to 127.0.0.1:upstream_port whose first requests meet `schedule` in turn (the rest
  // kNone), or nullptr with `why` set.
  static std::unique_ptr<FaultProxy> Start(int upstream_port, std::vector<Fault> schedule,
                                           std::string* why) {
    auto proxy = std::unique_ptr<FaultProxy>(new FaultProxy(upstream_port));
    proxy->Schedule(std::move(schedule));
    proxy->listen_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr = Loopback(0);
    socklen_t len = sizeof(addr);
    if (proxy->listen_ < 0 ||
        ::bind(proxy->listen_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::listen(proxy->listen_, 64) != 0 ||
        ::getsockname(proxy->listen_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      *why = "the fault proxy could not listen on 127.0.0.1";
      return nullptr;
    }
    proxy->port_ = ntohs(addr.sin_port);
    proxy->acceptor_ = std::thread([p = proxy.get()] { p->Accept(); });
    return proxy;
  }

  ~FaultProxy() {
    stop_ = true;
    if (acceptor_.joinable()) acceptor_.join();
    std::vector<std::thread> connections;
    {
      std::lock_guard lock(mu_);
      connections.swap(connections_);
    }
    for (std::thread& t : connections) t.join();
    if (listen_ >= 0) ::close(listen_);
  }

  std::string Url(const std::string& path) const {
    return fmt::format("http://127.0.0.1:{}/{}", port_, path);
  }
  // The faults the next requests meet, from now on.
  void Schedule(std::vector<Fault> schedule) {
    std::lock_guard lock(mu_);
    schedule_ = std::move(schedule);
    next_ = 0;
  }
  int requests() const { return requests_; }
  int faults_served() const { return faults_; }

 private:
  explicit FaultProxy(int upstream) : upstream_(upstream) {}

  static sockaddr_in Loopback(int port) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    return addr;
  }

  // Waits for `fd` to be ready for `events` for at most `ms` (in 100 ms steps, stopping early
  // when the proxy stops): true when it is.
  bool Wait(int fd, short events, int ms) const {
    for (int waited = 0; waited < ms && !stop_; waited += 100) {
      pollfd p{fd, events, 0};
      if (::poll(&p, 1, 100) > 0) return true;
    }
    return false;
  }

  void Accept() {
    while (Wait(listen_, POLLIN, 1 << 30)) {
      const int client = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      Bound(client);
      std::lock_guard lock(mu_);
      connections_.emplace_back([this, client] {
        Serve(client);
        ::close(client);
      });
    }
  }

  Fault Next() {
    std::lock_guard lock(mu_);
    ++requests_;
    return next_ < schedule_.size() ? schedule_[next_++] : Fault::kNone;
  }

  // Reads until `end` is in `*out` or the peer closes; false on a timeout, an error or more than
  // 64 MiB (the tests' objects are far smaller).
  bool ReadUntil(int fd, std::string* out, std::string_view end) const {
    char buffer[65536];
    while (end.empty() || out->find(end) == std::string::npos) {
      if (!Wait(fd, POLLIN, 5000)) return false;
      const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
      if (n < 0) return false;
      if (n == 0) return end.empty();
      out->append(buffer, static_cast<size_t>(n));
      if (out->size() > (64u << 20)) return false;
    }
    return true;
  }

  // Sends on `fd` give up after 5 s (a peer that stops reading).
  static void Bound(int fd) {
    const timeval five{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &five, sizeof(five));
  }

  static void Send(int fd, std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return;
      bytes.remove_prefix(static_cast<size_t>(n));
    }
  }

  // The request with its Connection header made "close".
  static std::string Closing(const std::string& request) {
    std::string out;
    size_t start = 0;
    while (start < request.size()) {
      size_t end = request.find("\r\n", start);
      if (end == std::string::npos) end = request.size();
      const std::string line = request.substr(start, end - start);
      start = end + 2;
      if (line.empty()) break;
      if (line.size() >= 11 && strncasecmp(line.c_str(), "connection:", 11) == 0) continue;
      out += line + "\r\n";
    }
    return out + "Connection: close\r\n\r\n";
  }

  // The server's whole answer to `request`; empty when it could not be had.
  std::string Ask(const std::string& request) const {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr = Loopback(upstream_);
    std::string answer;
    if (fd >= 0) Bound(fd);
    if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      Send(fd, Closing(request));
      if (!ReadUntil(fd, &answer, "")) answer.clear();
    }
    if (fd >= 0) ::close(fd);
    return answer;
  }

  void Serve(int client) {
    std::string request;
    if (!ReadUntil(client, &request, "\r\n\r\n")) return;
    const Fault fault = Next();
    if (fault != Fault::kNone) ++faults_;
    if (fault == Fault::kUnavailable || fault == Fault::kForbidden) {
      Send(client, fault == Fault::kUnavailable
                       ? "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 0\r\n"
                         "Content-Length: 0\r\nConnection: close\r\n\r\n"
                       : "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
      return;
    }
    const std::string answer = Ask(request.substr(0, request.find("\r\n\r\n") + 4));
    const size_t body = answer.find("\r\n\r\n");
    if (fault == Fault::kNone || body == std::string::npos) {
      Send(client, answer);
      return;
    }
    Send(client, std::string_view(answer).substr(0, body + 4 + (answer.size() - body - 4) / 2));
    if (fault == Fault::kReset) {
      const linger hard{1, 0};  // close() sends RST
      ::setsockopt(client, SOL_SOCKET, SO_LINGER, &hard, sizeof(hard));
    } else if (fault == Fault::kStall) {
      std::string ignored;
      for (int i = 0; i < 4 && !stop_; ++i) {  // until the client closes: 20 s at most
        if (ReadUntil(client, &ignored, "")) break;
      }
    }
  }

  const int upstream_;
  int listen_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<std::thread> connections_;  // guarded by mu_
  std::vector<Fault> schedule_;           // guarded by mu_
  size_t next_ = 0;                       // guarded by mu_
  std::atomic<int> requests_{0};
  std::atomic<int> faults_{0};
};

}  // namespace loadstone::testing

#endif  // LOADSTONE_TESTS_TESTING_FAULT_PROXY_H_
