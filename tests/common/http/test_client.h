// A blocking loopback HTTP client on raw sockets, for server tests: what goes over the
// wire is exactly what the test wrote.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <string_view>

#include <doctest/doctest.h>

namespace kvfleet::http::testing {

class Client {
 public:
  explicit Client(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    timeval tv{5, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~Client() { Close(); }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  void Send(std::string_view s) {
    while (!s.empty()) {
      ssize_t n = ::send(fd_, s.data(), s.size(), MSG_NOSIGNAL);
      if (n <= 0) return;
      s.remove_prefix(static_cast<size_t>(n));
    }
  }
  // Reads until `needle` has been seen (or EOF / timeout); returns everything read.
  std::string ReadUntil(std::string_view needle) {
    // Each read searches only what it added (and the needle's length before it), so a
    // response of many megabytes reads in linear time.
    size_t from = 0;
    size_t at;
    while ((at = buf_.find(needle, from)) == std::string::npos) {
      from = buf_.size() >= needle.size() ? buf_.size() - needle.size() + 1 : 0;
      char tmp[64 * 1024];
      ssize_t n = ::recv(fd_, tmp, sizeof(tmp), 0);
      if (n <= 0) break;
      buf_.append(tmp, static_cast<size_t>(n));
    }
    size_t end = at == std::string::npos ? buf_.size() : at + needle.size();
    std::string out = buf_.substr(0, end);
    buf_.erase(0, end);
    return out;
  }
  // Reads until the server closes the connection (or a timeout); returns everything read.
  std::string ReadAll() { return ReadUntil("\x01never\x02"); }
  // True when the server closed the connection.
  bool ReadEof() {
    char tmp[256];
    return ::recv(fd_, tmp, sizeof(tmp), 0) == 0;
  }

 private:
  int fd_ = -1;
  std::string buf_;
};

// Sends one request and reads one Content-Length response (status line..body).
inline std::string Roundtrip(uint16_t port, const std::string& method, const std::string& path,
                             const std::string& body = "", const std::string& extra_headers = "") {
  Client c(port);
  c.Send(method + " " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + extra_headers +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  return c.ReadUntil("\x01never\x02");
}

inline int StatusOf(const std::string& response) {
  return response.size() > 12 ? std::stoi(response.substr(9, 3)) : 0;
}

inline std::string BodyOf(const std::string& response) {
  size_t at = response.find("\r\n\r\n");
  return at == std::string::npos ? "" : response.substr(at + 4);
}

}  // namespace kvfleet::http::testing
