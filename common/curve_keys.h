// ZMQ CURVE keys from files, and a ZAP handler that admits only known client keys.
//
// Files (text, Z85, 40 characters per key):
//   key pair file:        line 1 the public key, line 2 the secret key (mode 0600).
//   public key file:      one line, a public key.
//   authorized keys file: one public key per line; blank lines and '#' comments ignored.
//
// A CURVE server (worker PUB and replay ROUTER) loads its key pair; with an authorized
// keys file it also runs a ZapAuthenticator, so only the listed clients (routers) may
// connect. A CURVE client (router SUB and DEALER) loads its own key pair and the server's
// public key.
//
// Thread safety: the loaders are free functions; a ZapAuthenticator runs one thread and is
// safe to destroy from the thread that made it.
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include <zmq.hpp>

#include "common/status.h"

namespace kvfleet {

struct CurveKeyPair {
  std::string public_key;  // Z85
  std::string secret_key;  // Z85
};

bool CurveAvailable();  // libzmq was built with CURVE (libsodium)
Result<CurveKeyPair> GenerateCurveKeyPair();
Result<CurveKeyPair> LoadCurveKeyPair(const std::string& path);
Result<std::string> LoadCurvePublicKey(const std::string& path);
Result<std::set<std::string>> LoadAuthorizedKeys(const std::string& path);
// Writes a key pair file (mode 0600).
Status WriteCurveKeyPair(const std::string& path, const CurveKeyPair& keys);

// Makes `socket` a CURVE server with `keys`. Call before bind.
Status MakeCurveServer(zmq::socket_t& socket, const CurveKeyPair& keys);
// Makes `socket` a CURVE client of the server with public key `server_public`. Before connect.
Status MakeCurveClient(zmq::socket_t& socket, const CurveKeyPair& keys, const std::string& server_public);

// Answers ZAP requests (RFC 27) on inproc://zeromq.zap.01 of `context`: CURVE clients whose
// public key is in `authorized` are admitted, everything else is refused. An admitted
// client's messages carry its public key (Z85) as their "User-Id" property
// (zmq::message_t::gets). `on_refused`, when set, is called on the authenticator's thread
// with each refused client's key (Z85; empty when it did not offer CURVE).
class ZapAuthenticator {
 public:
  // REQUIRES: context outlives the authenticator; at most one per context.
  ZapAuthenticator(zmq::context_t* context, std::set<std::string> authorized_z85,
                   std::function<void(const std::string&)> on_refused = {});
  ~ZapAuthenticator();
  ZapAuthenticator(const ZapAuthenticator&) = delete;
  ZapAuthenticator& operator=(const ZapAuthenticator&) = delete;
  Status status() const { return status_; }

 private:
  zmq::context_t* context_;
  std::set<std::string> authorized_;  // binary 32-byte keys
  std::function<void(const std::string&)> on_refused_;
  Status status_;
  std::string stop_endpoint_;
  std::thread thread_;
};

}  // namespace kvfleet
