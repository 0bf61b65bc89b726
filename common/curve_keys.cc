#include "common/curve_keys.h"

#include <sys/stat.h>

#include <atomic>
#include <fstream>
#include <sstream>
#include <vector>

#include <zmq_addon.hpp>

namespace kvfleet {

namespace {

constexpr size_t kZ85KeyChars = 40;
constexpr size_t kBinaryKeyBytes = 32;

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

Result<std::vector<std::string>> ReadKeyLines(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot read key file " + path);
  std::vector<std::string> keys;
  std::string line;
  while (std::getline(in, line)) {
    line = Trim(line);
    if (line.empty() || line[0] == '#') continue;
    if (line.size() != kZ85KeyChars) return InvalidArgument(path + ": a key is 40 Z85 characters");
    uint8_t bin[kBinaryKeyBytes];
    if (zmq_z85_decode(bin, line.c_str()) == nullptr) return InvalidArgument(path + ": not a Z85 key");
    keys.push_back(line);
  }
  return keys;
}

}  // namespace

bool CurveAvailable() { return zmq_has("curve") == 1; }

Result<CurveKeyPair> GenerateCurveKeyPair() {
  char pub[kZ85KeyChars + 1], sec[kZ85KeyChars + 1];
  if (zmq_curve_keypair(pub, sec) != 0) return Unimplemented("libzmq has no CURVE support");
  return CurveKeyPair{pub, sec};
}

Result<CurveKeyPair> LoadCurveKeyPair(const std::string& path) {
  KVF_ASSIGN_OR_RETURN(auto lines, ReadKeyLines(path));
  if (lines.size() != 2) return InvalidArgument(path + ": a key pair file has a public and a secret key line");
  return CurveKeyPair{lines[0], lines[1]};
}

Result<std::string> LoadCurvePublicKey(const std::string& path) {
  KVF_ASSIGN_OR_RETURN(auto lines, ReadKeyLines(path));
  if (lines.empty()) return InvalidArgument(path + ": no public key");
  return lines[0];
}

Result<std::set<std::string>> LoadAuthorizedKeys(const std::string& path) {
  KVF_ASSIGN_OR_RETURN(auto lines, ReadKeyLines(path));
  return std::set<std::string>(lines.begin(), lines.end());
}

Status WriteCurveKeyPair(const std::string& path, const CurveKeyPair& keys) {
  {
    std::ofstream out(path, std::ios::trunc);
    if (!out) return Unavailable("cannot write " + path);
    out << keys.public_key << "\n" << keys.secret_key << "\n";
  }
  chmod(path.c_str(), 0600);
  return Status::Ok();
}

Status MakeCurveServer(zmq::socket_t& socket, const CurveKeyPair& keys) {
  if (!CurveAvailable()) return Unimplemented("libzmq has no CURVE support");
  try {
    socket.set(zmq::sockopt::curve_server, 1);
    socket.set(zmq::sockopt::curve_secretkey, keys.secret_key);
    socket.set(zmq::sockopt::zap_domain, "kvfleet");
  } catch (const zmq::error_t& e) {
    return InvalidArgument(std::string("CURVE server setup: ") + e.what());
  }
  return Status::Ok();
}

Status MakeCurveClient(zmq::socket_t& socket, const CurveKeyPair& keys, const std::string& server_public) {
  if (!CurveAvailable()) return Unimplemented("libzmq has no CURVE support");
  try {
    socket.set(zmq::sockopt::curve_serverkey, server_public);
    socket.set(zmq::sockopt::curve_publickey, keys.public_key);
    socket.set(zmq::sockopt::curve_secretkey, keys.secret_key);
  } catch (const zmq::error_t& e) {
    return InvalidArgument(std::string("CURVE client setup: ") + e.what());
  }
  return Status::Ok();
}

ZapAuthenticator::ZapAuthenticator(zmq::context_t* context, std::set<std::string> authorized_z85,
                                   std::function<void(const std::string&)> on_refused)
    : context_(context), on_refused_(std::move(on_refused)) {
  for (const std::string& k : authorized_z85) {
    uint8_t bin[kBinaryKeyBytes];
    if (zmq_z85_decode(bin, k.c_str())) authorized_.emplace(reinterpret_cast<char*>(bin), kBinaryKeyBytes);
  }
  static std::atomic<uint64_t> next_id{0};
  stop_endpoint_ = "inproc://kvfleet-zap-stop-" + std::to_string(next_id++);
  zmq::socket_t handler(*context_, zmq::socket_type::rep);
  try {
    handler.bind("inproc://zeromq.zap.01");
  } catch (const zmq::error_t& e) {
    status_ = Unavailable(std::string("ZAP handler bind: ") + e.what());
    return;
  }
  zmq::socket_t stop(*context_, zmq::socket_type::pair);
  stop.bind(stop_endpoint_);
  thread_ = std::thread([this, h = std::move(handler), s = std::move(stop)]() mutable {
    zmq::pollitem_t items[] = {{h.handle(), 0, ZMQ_POLLIN, 0}, {s.handle(), 0, ZMQ_POLLIN, 0}};
    while (true) {
      zmq::poll(items, 2, std::chrono::milliseconds(-1));
      if (items[1].revents & ZMQ_POLLIN) break;
      if (!(items[0].revents & ZMQ_POLLIN)) continue;
      std::vector<zmq::message_t> req;
      if (!zmq::recv_multipart(h, std::back_inserter(req))) continue;
      // RFC 27: version, request id, domain, address, identity, mechanism, credentials...
      if (req.size() < 6) continue;
      const bool curve = req[5].to_string() == "CURVE" && req.size() >= 7;
      const std::string key = curve && req[6].size() == kBinaryKeyBytes ? req[6].to_string() : std::string();
      const bool ok = !key.empty() && authorized_.count(key) > 0;
      char key_z85[kZ85KeyChars + 1] = {};
      if (!key.empty()) zmq_z85_encode(key_z85, reinterpret_cast<const uint8_t*>(key.data()), kBinaryKeyBytes);
      if (!ok && on_refused_) on_refused_(key_z85);
      std::vector<zmq::message_t> reply;
      reply.emplace_back(req[0].data(), req[0].size());
      reply.emplace_back(req[1].data(), req[1].size());
      reply.emplace_back(std::string(ok ? "200" : "400"));
      reply.emplace_back(std::string(ok ? "OK" : "unknown client key"));
      reply.emplace_back(std::string(ok ? key_z85 : ""));
      reply.emplace_back();
      zmq::send_multipart(h, reply);
    }
  });
}

ZapAuthenticator::~ZapAuthenticator() {
  if (!thread_.joinable()) return;
  zmq::socket_t stop(*context_, zmq::socket_type::pair);
  stop.connect(stop_endpoint_);
  stop.send(zmq::str_buffer("stop"), zmq::send_flags::none);
  thread_.join();
}

}  // namespace kvfleet
