// The rendezvous key-value store over TCP (tcp_store.h).
//
// Wire format: every message is a frame, a 4-byte big-endian payload length and the payload.
// A request's payload is [u8 op][u32 id][fields]; a reply's is [u32 id][u8 status][fields]. Integers
// are big-endian, strings and byte strings are [u32 length][bytes]. The id pairs a reply with its
// request, so that a client that gave up waiting (its timeout) can skip the late reply.
//   HELLO  magic, i32 rank, token        -> OK magic | REFUSED message (then the server closes)
//   SET    key, value                    -> OK
//   GET    key                           -> OK value, once the key exists
//   ADD    key, i64 delta                -> OK i64 new value (stored as decimal text) | INVALID message
//   CHECK  u32 n, n keys                 -> OK u32 m, m indices of the keys that are missing
//   WAIT   u32 n, n keys                 -> OK, once every key exists
//   CANCEL u32 id of a pending GET/WAIT  -> (no reply; the pending request is dropped)
//   LOST   (nothing)                     -> OK u32 n, n i32 ranks
//   BYE    (nothing)                     -> (no reply; the server closes the connection)
// HELLO must be the first request; anything else first, a wrong token, or a frame larger than a
// HELLO can be closes the connection before any key is read or written.
#include "tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "error.h"

namespace rc {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kMagic = 0x52435331;  // "RCS1": the protocol's version
constexpr size_t kMaxKeyBytes = 4096;
constexpr size_t kMaxValueBytes = size_t{64} << 20;
constexpr size_t kMaxKeysPerRequest = 4096;
constexpr size_t kMaxTokenBytes = 1024;
// The largest frame before HELLO succeeded: a HELLO with the longest token. A stray client cannot
// make the server hold more than this.
constexpr size_t kMaxHelloFrame = 64 + kMaxTokenBytes;
// The largest frame after: a SET of the largest value, or a WAIT of the most keys (both bounds).
constexpr size_t kMaxFrame = kMaxValueBytes + kMaxKeyBytes + 64;
// A reply larger than this waiting to be sent means the client stopped reading: it is dropped.
constexpr size_t kMaxPendingOutput = 4 * kMaxValueBytes;
// How long a new connection may take to present its HELLO.
constexpr auto kHelloTimeout = std::chrono::seconds(10);
constexpr size_t kMaxConnections = 4096;

enum Op : uint8_t { kHello = 1, kSet, kGet, kAdd, kCheck, kWait, kCancel, kLost, kBye };
enum Status : uint8_t { kOk = 0, kInvalid = 1, kRefused = 2 };

#ifdef MSG_NOSIGNAL
constexpr int kSendFlags = MSG_NOSIGNAL;
#else
constexpr int kSendFlags = 0;
#endif

// ---- encoding -----------------------------------------------------------------------------------

void putU32(std::string& out, uint32_t v) {
  const char b[4] = {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
                     static_cast<char>(v)};
  out.append(b, 4);
}
void putU64(std::string& out, uint64_t v) {
  putU32(out, static_cast<uint32_t>(v >> 32));
  putU32(out, static_cast<uint32_t>(v));
}
void putBytes(std::string& out, const char* data, size_t size) {
  putU32(out, static_cast<uint32_t>(size));
  out.append(data, size);
}
void putString(std::string& out, const std::string& s) { putBytes(out, s.data(), s.size()); }

uint32_t readU32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return (uint32_t{u[0]} << 24) | (uint32_t{u[1]} << 16) | (uint32_t{u[2]} << 8) | uint32_t{u[3]};
}

// Reads the fields of one payload; every read is bounds-checked, `ok` turns false on the first that
// runs past the end (a malformed frame) and the rest return empty values.
class Reader {
 public:
  Reader(const char* data, size_t size) : p_(data), end_(data + size) {}
  bool ok() const { return ok_; }
  bool atEnd() const { return ok_ && p_ == end_; }
  uint8_t u8() { return need(1) ? static_cast<uint8_t>(*p_++) : 0; }
  uint32_t u32() {
    if (!need(4)) return 0;
    const uint32_t v = readU32(p_);
    p_ += 4;
    return v;
  }
  uint64_t u64() {
    const uint64_t hi = u32();
    return (hi << 32) | u32();
  }
  // A byte string of at most `limit` bytes.
  std::string bytes(size_t limit) {
    const uint32_t n = u32();
    if (!ok_ || n > limit || !need(n)) {
      ok_ = false;
      return {};
    }
    std::string s(p_, n);
    p_ += n;
    return s;
  }
  std::vector<std::string> keys() {
    const uint32_t n = u32();
    std::vector<std::string> out;
    if (!ok_ || n > kMaxKeysPerRequest || n > static_cast<size_t>(end_ - p_) / 4) {
      ok_ = false;
      return out;
    }
    out.reserve(n);
    for (uint32_t i = 0; i < n && ok_; ++i) out.push_back(bytes(kMaxKeyBytes));
    return out;
  }

 private:
  bool need(size_t n) {
    if (ok_ && static_cast<size_t>(end_ - p_) >= n) return true;
    ok_ = false;
    return false;
  }
  const char* p_;
  const char* end_;
  bool ok_ = true;
};

// A frame: the length prefix, then the payload.
std::string frame(const std::string& payload) {
  std::string out;
  out.reserve(4 + payload.size());
  putU32(out, static_cast<uint32_t>(payload.size()));
  out += payload;
  return out;
}

// Equal strings, in a time that depends only on the presented string's length (not on where the
// first difference is), so that timing does not reveal the token a byte at a time.
bool constantTimeEqual(const std::string& expected, const std::string& presented) {
  unsigned diff = expected.size() == presented.size() ? 0u : 1u;
  for (size_t i = 0; i < presented.size(); ++i) {
    const char e = expected.empty() ? '\0' : expected[i % expected.size()];
    diff |= static_cast<unsigned char>(e ^ presented[i]);
  }
  return diff == 0;
}

// ---- sockets ------------------------------------------------------------------------------------

std::string errnoText(int err) { return std::strerror(err); }

// host:port, with brackets around an IPv6 address.
std::string endpoint(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

void setNonBlockingCloseOnExec(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags >= 0) fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  const int fdFlags = fcntl(fd, F_GETFD, 0);
  if (fdFlags >= 0) fcntl(fd, F_SETFD, fdFlags | FD_CLOEXEC);
}

void setNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

struct AddrInfoList {
  addrinfo* head = nullptr;
  ~AddrInfoList() {
    if (head) freeaddrinfo(head);
  }
};

// Resolves host:port for a stream socket; returns getaddrinfo's error (0 on success).
int resolve(const std::string& host, int port, AddrInfoList& out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_protocol = IPPROTO_TCP;
  return getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &out.head);
}

int boundPort(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return 0;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return 0;
}

// Milliseconds from now until `deadline`, for poll (0 once it has passed).
int msUntil(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
}

Clock::time_point deadlineAfter(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

void checkKey(const std::string& key) {
  RC_CHECK_ARG(!key.empty() && key.size() <= kMaxKeyBytes,
               "a store key must have 1 to " << kMaxKeyBytes << " bytes, got " << key.size());
}

void checkKeys(const std::vector<std::string>& keys) {
  RC_CHECK_ARG(keys.size() <= kMaxKeysPerRequest,
               "at most " << kMaxKeysPerRequest << " store keys per call, got " << keys.size());
  for (const auto& key : keys) checkKey(key);
}

std::string quotedList(const std::vector<std::string>& keys) {
  std::string out;
  for (size_t i = 0; i < keys.size(); ++i) out += (i ? ", '" : "'") + keys[i] + "'";
  return out;
}

}  // namespace

// ---- server -------------------------------------------------------------------------------------

struct TcpStoreServer::Impl {
  struct Connection {
    int fd = -1;
    std::string in;   // bytes received, not yet a whole frame
    std::string out;  // reply bytes not yet sent
    bool authenticated = false;
    int rank = -1;
    bool saidBye = false;
    bool closing = false;  // close once `out` is sent (a refused HELLO)
    Clock::time_point helloDeadline;
  };
  // A GET or WAIT that waits for keys to exist.
  struct Waiter {
    uint64_t connection;
    uint32_t id;
    bool isGet;
    std::vector<std::string> keys;
  };

  std::string host;
  std::string token;
  std::vector<int> listeners;
  int port = 0;
  int wakeRead = -1, wakeWrite = -1;
  std::thread thread;

  // Touched by the serving thread only.
  std::map<uint64_t, Connection> connections;
  uint64_t nextConnection = 1;
  std::map<std::string, std::string> data;
  std::vector<Waiter> waiters;
  std::set<int> lost;

  ~Impl() {
    for (int fd : listeners) close(fd);
    if (wakeRead >= 0) close(wakeRead);
    if (wakeWrite >= 0) close(wakeWrite);
    for (auto& [id, c] : connections) close(c.fd);
  }

  void bindAll(int requestedPort) {
    AddrInfoList addrs;
    const int rc = resolve(host, requestedPort, addrs);
    RC_CHECK_ARG(rc == 0, "TcpStoreServer: cannot resolve host '" << host << "': " << gai_strerror(rc));
    std::string lastError = "no address";
    int portToBind = requestedPort;
    for (addrinfo* ai = addrs.head; ai; ai = ai->ai_next) {
      // Every address of the host listens on the same port (the first one's, when 0 was asked).
      if (ai->ai_family == AF_INET) {
        reinterpret_cast<sockaddr_in*>(ai->ai_addr)->sin_port = htons(static_cast<uint16_t>(portToBind));
      } else if (ai->ai_family == AF_INET6) {
        reinterpret_cast<sockaddr_in6*>(ai->ai_addr)->sin6_port = htons(static_cast<uint16_t>(portToBind));
      } else {
        continue;
      }
      const int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
      if (fd < 0) {
        lastError = errnoText(errno);
        continue;
      }
      setNonBlockingCloseOnExec(fd);
      int one = 1;
      // A restarted job can listen again on the port its previous store used (TIME_WAIT).
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      // "::" means IPv6 only: the store listens on what it was given, nothing more.
      if (ai->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
      if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 128) != 0) {
        lastError = errnoText(errno);
        const int err = errno;
        close(fd);
        if (listeners.empty() && err == EADDRINUSE) {
          RC_THROW(code::kDistributed, "TcpStoreServer: cannot listen on " << endpoint(host, requestedPort) << ": "
                                                                           << lastError
                                                                           << " (another job or store uses the port?)");
        }
        continue;
      }
      listeners.push_back(fd);
      if (portToBind == 0) portToBind = boundPort(fd);
    }
    RC_CHECK_ARG(!listeners.empty(), "TcpStoreServer: cannot listen on "
                                         << endpoint(host, requestedPort) << ": " << lastError
                                         << " (is the host an address of this machine?)");
    port = portToBind;
  }

  void wake() {
    const char b = 1;
    while (write(wakeWrite, &b, 1) < 0 && errno == EINTR) {
    }
  }

  // ---- the serving thread --------------------------------------------------------------------

  void serve() {
    std::vector<pollfd> fds;
    std::vector<uint64_t> ids;
    for (;;) {
      fds.clear();
      ids.clear();
      fds.push_back({wakeRead, POLLIN, 0});
      for (int fd : listeners) fds.push_back({fd, static_cast<short>(POLLIN), 0});
      const size_t firstConnection = fds.size();
      Clock::time_point nextDeadline = Clock::now() + std::chrono::hours(1);
      for (auto& [id, c] : connections) {
        short events = c.closing ? 0 : POLLIN;
        if (!c.out.empty()) events |= POLLOUT;
        fds.push_back({c.fd, events, 0});
        ids.push_back(id);
        if (!c.authenticated) nextDeadline = std::min(nextDeadline, c.helloDeadline);
      }
      const int n = poll(fds.data(), fds.size(), msUntil(nextDeadline));
      if (n < 0 && errno != EINTR) return;  // cannot happen with valid descriptors; stop serving
      if (fds[0].revents) return;           // the destructor asked to stop
      for (size_t i = 1; i < firstConnection; ++i) {
        if (fds[i].revents & POLLIN) acceptAll(fds[i].fd);
      }
      for (size_t i = firstConnection; i < fds.size(); ++i) {
        auto it = connections.find(ids[i - firstConnection]);
        if (it == connections.end()) continue;
        bool keep = true;
        try {
          keep = service(it->first, it->second, fds[i].revents);
        } catch (...) {
          keep = false;  // out of memory for one client's request: drop that client, keep serving
        }
        if (!keep) drop(it->first);
      }
      const auto now = Clock::now();
      std::vector<uint64_t> late;
      for (auto& [id, c] : connections) {
        if (!c.authenticated && now >= c.helloDeadline) late.push_back(id);
      }
      for (uint64_t id : late) drop(id);
    }
  }

  void acceptAll(int listener) {
    for (;;) {
#ifdef __linux__
      // Close-on-exec from the start: a process spawned meanwhile must not inherit the connection.
      const int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
#else
      const int fd = accept(listener, nullptr, nullptr);
#endif
      if (fd < 0) return;  // EAGAIN (accepted everything), or an error of one pending connection
      if (connections.size() >= kMaxConnections) {
        close(fd);
        continue;
      }
      setNonBlockingCloseOnExec(fd);
      setNoDelay(fd);
      Connection c;
      c.fd = fd;
      c.helloDeadline = Clock::now() + kHelloTimeout;
      connections.emplace(nextConnection++, std::move(c));
    }
  }

  // Reads, handles whole frames and writes; false when the connection is to be closed.
  bool service(uint64_t id, Connection& c, short revents) {
    if (revents & POLLOUT && !flush(c)) return false;
    if (c.closing) return !c.out.empty();
    if (revents & (POLLIN | POLLHUP | POLLERR)) {
      char buffer[65536];
      // At most 16 reads per round, so that one busy client cannot keep the others waiting.
      for (int reads = 0; reads < 16; ++reads) {
        const ssize_t got = recv(c.fd, buffer, sizeof(buffer), 0);
        if (got == 0) return false;  // the client closed
        if (got < 0) {
          if (errno == EINTR) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) break;
          return false;
        }
        c.in.append(buffer, static_cast<size_t>(got));
        if (!handleFrames(id, c)) return false;
        if (c.closing || c.saidBye) break;
      }
    }
    if (c.saidBye) return false;
    if (!c.out.empty() && !flush(c)) return false;
    return !(c.closing && c.out.empty());
  }

  bool handleFrames(uint64_t id, Connection& c) {
    size_t offset = 0;
    while (c.in.size() - offset >= 4) {
      const size_t length = readU32(c.in.data() + offset);
      if (length > (c.authenticated ? kMaxFrame : kMaxHelloFrame)) return false;
      if (c.in.size() - offset - 4 < length) break;
      const bool keep = handle(id, c, Reader(c.in.data() + offset + 4, length));
      offset += 4 + length;
      if (!keep) return false;
      if (c.closing || c.saidBye) break;
    }
    c.in.erase(0, offset);
    // A frame announced within the limits but not complete yet: the buffer holds only what came.
    return true;
  }

  void reply(Connection& c, uint32_t requestId, Status status, const std::string& fields = {}) {
    std::string payload;
    putU32(payload, requestId);
    payload.push_back(static_cast<char>(status));
    payload += fields;
    c.out += frame(payload);
  }

  // One request; false closes the connection (a malformed or unauthenticated request).
  bool handle(uint64_t id, Connection& c, Reader r) {
    const uint8_t op = r.u8();
    const uint32_t requestId = r.u32();
    if (!r.ok()) return false;
    if (!c.authenticated) {
      if (op != kHello) return false;
      const uint32_t magic = r.u32();
      const int32_t rank = static_cast<int32_t>(r.u32());
      const std::string presented = r.bytes(kMaxTokenBytes);
      if (!r.atEnd() || magic != kMagic || rank < 0) return false;
      if (!token.empty() && !constantTimeEqual(token, presented)) {
        std::string fields;
        putString(fields, "the store refused the token this client presented");
        reply(c, requestId, kRefused, fields);
        c.closing = true;
        return true;
      }
      c.authenticated = true;
      c.rank = rank;
      std::string fields;
      putU32(fields, kMagic);
      reply(c, requestId, kOk, fields);
      return true;
    }
    switch (op) {
      case kSet: {
        std::string key = r.bytes(kMaxKeyBytes);
        std::string value = r.bytes(kMaxValueBytes);
        if (!r.atEnd()) return false;
        data[std::move(key)] = std::move(value);
        reply(c, requestId, kOk);
        wakeWaiters();
        return true;
      }
      case kGet: {
        std::string key = r.bytes(kMaxKeyBytes);
        if (!r.atEnd()) return false;
        waiters.push_back({id, requestId, true, {std::move(key)}});
        wakeWaiters();
        return true;
      }
      case kWait: {
        std::vector<std::string> keys = r.keys();
        if (!r.atEnd()) return false;
        waiters.push_back({id, requestId, false, std::move(keys)});
        wakeWaiters();
        return true;
      }
      case kAdd: {
        std::string key = r.bytes(kMaxKeyBytes);
        const int64_t delta = static_cast<int64_t>(r.u64());
        if (!r.atEnd()) return false;
        int64_t value = 0;
        auto it = data.find(key);
        if (it != data.end() && !parseInt(it->second, value)) {
          std::string fields;
          putString(fields, "key '" + key + "' holds a value that is not a decimal integer");
          reply(c, requestId, kInvalid, fields);
          return true;
        }
        value = static_cast<int64_t>(static_cast<uint64_t>(value) + static_cast<uint64_t>(delta));
        data[key] = std::to_string(value);
        std::string fields;
        putU64(fields, static_cast<uint64_t>(value));
        reply(c, requestId, kOk, fields);
        wakeWaiters();
        return true;
      }
      case kCheck: {
        const std::vector<std::string> keys = r.keys();
        if (!r.atEnd()) return false;
        std::vector<uint32_t> missing;
        for (size_t i = 0; i < keys.size(); ++i) {
          if (!data.count(keys[i])) missing.push_back(static_cast<uint32_t>(i));
        }
        std::string fields;
        putU32(fields, static_cast<uint32_t>(missing.size()));
        for (uint32_t i : missing) putU32(fields, i);
        reply(c, requestId, kOk, fields);
        return true;
      }
      case kCancel: {
        const uint32_t cancelled = r.u32();
        if (!r.atEnd()) return false;
        waiters.erase(std::remove_if(waiters.begin(), waiters.end(),
                                     [&](const Waiter& w) { return w.connection == id && w.id == cancelled; }),
                      waiters.end());
        return true;
      }
      case kLost: {
        if (!r.atEnd()) return false;
        std::string fields;
        putU32(fields, static_cast<uint32_t>(lost.size()));
        for (int rank : lost) putU32(fields, static_cast<uint32_t>(rank));
        reply(c, requestId, kOk, fields);
        return true;
      }
      case kBye: c.saidBye = true; return true;
      default: return false;
    }
  }

  static bool parseInt(const std::string& text, int64_t& out) {
    if (text.empty() || text.size() > 20) return false;
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (errno != 0 || end != text.c_str() + text.size()) return false;
    out = v;
    return true;
  }

  // Answers every GET and WAIT whose keys all exist now.
  void wakeWaiters() {
    auto ready = [&](const Waiter& w) {
      return std::all_of(w.keys.begin(), w.keys.end(), [&](const std::string& k) { return data.count(k) > 0; });
    };
    std::vector<Waiter> remaining;
    for (Waiter& w : waiters) {
      auto conn = connections.find(w.connection);
      if (conn == connections.end()) continue;
      if (!ready(w)) {
        remaining.push_back(std::move(w));
        continue;
      }
      std::string fields;
      if (w.isGet) {
        const std::string& value = data[w.keys[0]];
        putBytes(fields, value.data(), value.size());
      }
      reply(conn->second, w.id, kOk, fields);
    }
    waiters.swap(remaining);
  }

  // Sends what it can of `out`; false when the connection broke or the client stopped reading.
  bool flush(Connection& c) {
    size_t sent = 0;
    while (sent < c.out.size()) {
      const ssize_t n = send(c.fd, c.out.data() + sent, c.out.size() - sent, kSendFlags);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        return false;
      }
      sent += static_cast<size_t>(n);
    }
    c.out.erase(0, sent);
    return c.out.size() <= kMaxPendingOutput;
  }

  void drop(uint64_t id) {
    auto it = connections.find(id);
    if (it == connections.end()) return;
    // A client that goes without saying goodbye is a rank that died (or lost its network).
    if (it->second.authenticated && !it->second.saidBye) lost.insert(it->second.rank);
    close(it->second.fd);
    connections.erase(it);
    waiters.erase(std::remove_if(waiters.begin(), waiters.end(), [&](const Waiter& w) { return w.connection == id; }),
                  waiters.end());
  }
};

TcpStoreServer::TcpStoreServer(const TcpStoreAddress& address) : impl_(std::make_unique<Impl>()) {
  RC_CHECK_ARG(!address.host.empty(), "TcpStoreServer: host must not be empty");
  RC_CHECK_ARG(address.port >= 0 && address.port <= 65535,
               "TcpStoreServer: port must be between 0 and 65535, got " << address.port);
  RC_CHECK_ARG(address.token.size() <= kMaxTokenBytes,
               "TcpStoreServer: the token must have at most " << kMaxTokenBytes << " bytes");
  impl_->host = address.host;
  impl_->token = address.token;
  impl_->bindAll(address.port);
  int pipeFds[2];
  if (pipe(pipeFds) != 0) RC_THROW(code::kDistributed, "TcpStoreServer: pipe failed: " << errnoText(errno));
  impl_->wakeRead = pipeFds[0];
  impl_->wakeWrite = pipeFds[1];
  setNonBlockingCloseOnExec(impl_->wakeRead);
  setNonBlockingCloseOnExec(impl_->wakeWrite);
  Impl* impl = impl_.get();
  impl_->thread = std::thread([impl] { impl->serve(); });
}

TcpStoreServer::~TcpStoreServer() {
  if (impl_->thread.joinable()) {
    impl_->wake();
    impl_->thread.join();
  }
}

int TcpStoreServer::port() const { return impl_->port; }

// ---- client -------------------------------------------------------------------------------------

struct TcpStoreClient::Impl {
  TcpStoreAddress address;
  int rank = 0;
  double timeout = 0;
  int fd = -1;
  uint32_t nextId = 1;
  bool broken = false;  // the store went away; every later call says so
  std::mutex mutex;

  ~Impl() {
    if (fd >= 0) close(fd);
  }

  std::string where() const { return endpoint(address.host, address.port); }

  [[noreturn]] void throwClosed() {
    broken = true;
    RC_THROW(code::kDistributed, "the store at " << where() << " (served by rank 0) closed the connection");
  }

  // Connects to one of the host's addresses; returns the socket, or -1 with `error` set.
  int tryConnect(Clock::time_point deadline, std::string& error) {
    AddrInfoList addrs;
    const int rc = resolve(address.host, address.port, addrs);
    if (rc != 0) {
      error = std::string("cannot resolve host '") + address.host + "': " + gai_strerror(rc);
      return -1;
    }
    for (addrinfo* ai = addrs.head; ai; ai = ai->ai_next) {
      const int s = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
      if (s < 0) {
        error = errnoText(errno);
        continue;
      }
      setNonBlockingCloseOnExec(s);
      int err = connect(s, ai->ai_addr, ai->ai_addrlen) == 0 ? 0 : errno;
      if (err == EINPROGRESS) {
        pollfd p{s, POLLOUT, 0};
        // One address may be unroutable: give each a share of the time left, at least a second.
        const int wait = std::min(msUntil(deadline), std::max(1000, msUntil(deadline) / 2));
        const int n = poll(&p, 1, wait);
        socklen_t len = sizeof(err);
        if (n <= 0) {
          err = n == 0 ? ETIMEDOUT : errno;
        } else if (getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
          err = errno;
        }
      }
      if (err == 0) {
        setNoDelay(s);
        return s;
      }
      error = errnoText(err);
      close(s);
    }
    return -1;
  }

  void connectAndGreet() {
    const auto deadline = deadlineAfter(timeout);
    std::string lastError;
    auto pause = std::chrono::milliseconds(20);
    for (;;) {
      fd = tryConnect(deadline, lastError);
      if (fd >= 0) break;
      if (Clock::now() >= deadline) {
        RC_THROW(code::kDistributed, "no store answered at " << where() << " within " << timeout
                                                             << " s; is rank 0 running and MASTER_ADDR/MASTER_PORT "
                                                                "right? (last error: "
                                                             << lastError << ")");
      }
      // Retries every 20 ms at first, backing off to every second, with a last try at the deadline.
      std::this_thread::sleep_until(std::min(Clock::now() + pause, deadline));
      pause = std::min(pause * 2, std::chrono::milliseconds(1000));
    }
    // A connection made just before the deadline still gets a moment for the greeting.
    const auto greetingDeadline = std::max(deadline, Clock::now() + std::chrono::seconds(1));
    std::string fields;
    putU32(fields, kMagic);
    putU32(fields, static_cast<uint32_t>(rank));
    putString(fields, address.token);
    const uint32_t id = send(kHello, fields, greetingDeadline, "greeting");
    Status status = kOk;
    std::string reply;
    if (!receive(id, greetingDeadline, status, reply, true)) {
      broken = true;
      RC_THROW(code::kDistributed, "the service at " << where() << " did not answer the store's greeting within "
                                                     << timeout << " s; is MASTER_PORT the store's port?");
    }
    Reader r(reply.data(), reply.size());
    if (status == kRefused) {
      RC_THROW(code::kDistributed, "the store at " << where()
                                                   << " refused this client's token: every rank must present the "
                                                      "job's token (RESNET_STORE_TOKEN), the one rank 0 serves with");
    }
    if (status != kOk || r.u32() != kMagic || !r.atEnd()) {
      RC_THROW(code::kDistributed, "the service at " << where() << " is not a resnet-cuda store (unexpected answer)");
    }
  }

  // Sends one request; returns its id.
  uint32_t send(Op op, const std::string& fields, Clock::time_point deadline, const std::string& what) {
    if (broken) throwClosed();
    std::string payload;
    payload.push_back(static_cast<char>(op));
    const uint32_t id = nextId++;
    putU32(payload, id);
    payload += fields;
    const std::string bytes = frame(payload);
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, kSendFlags);
      if (n >= 0) {
        sent += static_cast<size_t>(n);
        continue;
      }
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) throwClosed();
      pollfd p{fd, POLLOUT, 0};
      const int ready = poll(&p, 1, msUntil(deadline));
      if (ready == 0) {
        broken = true;  // half a frame went out: the stream cannot be used any more
        RC_THROW(code::kDistributed,
                 "timed out after " << timeout << " s sending the " << what << " to the store at " << where());
      }
      if (ready < 0 && errno != EINTR) throwClosed();
    }
    return id;
  }

  // Reads exactly `size` bytes into `out`; false when the deadline passed first.
  bool readExact(char* out, size_t size, Clock::time_point deadline, bool greeting) {
    size_t got = 0;
    while (got < size) {
      const ssize_t n = recv(fd, out + got, size - got, 0);
      if (n > 0) {
        got += static_cast<size_t>(n);
        continue;
      }
      if (n == 0) {
        if (greeting) {
          broken = true;
          RC_THROW(code::kDistributed, "the service at " << where()
                                                         << " closed the connection at the greeting (not a "
                                                            "resnet-cuda store, or it refused this client)");
        }
        throwClosed();
      }
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) throwClosed();
      pollfd p{fd, POLLIN, 0};
      const int ready = poll(&p, 1, msUntil(deadline));
      if (ready == 0) {
        if (got == 0) return false;
        // Part of a frame came and then nothing: the stream is out of step.
        broken = true;
        return false;
      }
      if (ready < 0 && errno != EINTR) throwClosed();
    }
    return true;
  }

  // Waits for the reply to request `id` (skipping late replies to requests given up on); returns
  // its status and leaves its fields in `fields`. False when the deadline passed first: then the
  // store is told to drop the request (it keeps a GET or WAIT until its keys exist).
  bool receive(uint32_t id, Clock::time_point deadline, Status& status, std::string& fields, bool greeting = false) {
    for (;;) {
      char header[4];
      if (!readExact(header, 4, deadline, greeting)) return gaveUp(id);
      const size_t length = readU32(header);
      if (length < 5 || length > kMaxFrame) {
        broken = true;
        RC_THROW(code::kDistributed, "the service at " << where()
                                                       << " sent a malformed answer (not a resnet-cuda store of "
                                                          "this version?)");
      }
      std::string payload(length, '\0');
      if (!readExact(payload.data(), length, deadline, greeting)) {
        broken = true;  // half a frame: the stream is out of step
        return false;
      }
      const uint32_t replyId = readU32(payload.data());
      if (replyId != id) continue;  // a late answer to a request that timed out
      status = static_cast<Status>(static_cast<uint8_t>(payload[4]));
      fields = payload.substr(5);
      return true;
    }
  }

  bool gaveUp(uint32_t id) {
    if (broken) return false;
    std::string fields;
    putU32(fields, id);
    try {
      send(kCancel, fields, deadlineAfter(1.0), "cancellation");
    } catch (const Error&) {
      // The store went away: the caller reports its timeout, the next call the closed connection.
    }
    return false;
  }

  // Sends a request and returns the fields of its successful reply; throws "timed out after
  // `seconds` s waiting for `what`" when no reply came by then.
  std::string call(Op op, const std::string& request, double seconds, const std::string& what) {
    const auto deadline = deadlineAfter(seconds);
    const uint32_t id = send(op, request, deadline, "request for " + what);
    Status status = kOk;
    std::string fields;
    if (!receive(id, deadline, status, fields)) throwTimeout(seconds, what);
    expectOk(status, fields);
    return fields;
  }

  [[noreturn]] void throwTimeout(double seconds, const std::string& what) {
    std::string lostText;
    if (!broken) {
      // Which ranks died is the likely reason; asked briefly, as a hint only.
      try {
        const auto deadline = deadlineAfter(1.0);
        const uint32_t id = send(kLost, {}, deadline, "request for lost ranks");
        Status status = kOk;
        std::string fields;
        if (receive(id, deadline, status, fields) && status == kOk) {
          for (int r : parseRanks(fields)) lostText += (lostText.empty() ? "" : ", ") + std::to_string(r);
        }
      } catch (const Error&) {
        // The timeout is the error to report.
      }
    }
    RC_THROW(
        code::kDistributed,
        "timed out after " << seconds << " s waiting for " << what << " in the store at " << where()
                           << (lostText.empty() ? std::string() : "; ranks that died or disconnected: " + lostText));
  }

  std::vector<int> parseRanks(const std::string& fields) {
    Reader r(fields.data(), fields.size());
    const uint32_t n = r.u32();
    std::vector<int> ranks;
    for (uint32_t i = 0; i < n && r.ok(); ++i) ranks.push_back(static_cast<int32_t>(r.u32()));
    if (!r.atEnd()) malformed();
    return ranks;
  }

  // The indices of `keys` that do not exist in the store now.
  std::vector<uint32_t> missing(const std::vector<std::string>& keys, double seconds) {
    const std::string fields = call(kCheck, encodeKeys(keys), seconds, "the check of keys " + quotedList(keys));
    Reader r(fields.data(), fields.size());
    const uint32_t n = r.u32();
    std::vector<uint32_t> out;
    for (uint32_t i = 0; i < n && r.ok(); ++i) out.push_back(r.u32());
    if (!r.atEnd() || std::any_of(out.begin(), out.end(), [&](uint32_t i) { return i >= keys.size(); })) malformed();
    return out;
  }

  static std::string encodeKeys(const std::vector<std::string>& keys) {
    std::string fields;
    putU32(fields, static_cast<uint32_t>(keys.size()));
    for (const auto& key : keys) putString(fields, key);
    return fields;
  }

  void expectOk(Status status, const std::string& fields) {
    if (status == kOk) return;
    Reader r(fields.data(), fields.size());
    const std::string message = r.bytes(kMaxFrame);
    if (status == kInvalid && r.ok()) RC_THROW(code::kInvalidArgument, message);
    malformed();
  }

  [[noreturn]] void malformed() {
    broken = true;
    RC_THROW(code::kDistributed, "the store at " << where() << " sent a malformed answer");
  }
};

TcpStoreClient::TcpStoreClient(const TcpStoreAddress& address, int rank, double timeoutSeconds)
    : impl_(std::make_unique<Impl>()) {
  RC_CHECK_ARG(!address.host.empty(), "TcpStore: host must not be empty");
  RC_CHECK_ARG(address.port >= 1 && address.port <= 65535,
               "TcpStore: port must be between 1 and 65535, got " << address.port);
  RC_CHECK_ARG(address.token.size() <= kMaxTokenBytes,
               "TcpStore: the token must have at most " << kMaxTokenBytes << " bytes");
  RC_CHECK_ARG(rank >= 0, "TcpStore: rank must be at least 0, got " << rank);
  RC_CHECK_ARG(timeoutSeconds > 0 && timeoutSeconds <= 1e7,
               "TcpStore: timeoutSeconds must be positive (at most 1e7), got " << timeoutSeconds);
  impl_->address = address;
  impl_->rank = rank;
  impl_->timeout = timeoutSeconds;
  impl_->connectAndGreet();
}

TcpStoreClient::~TcpStoreClient() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (impl_->fd < 0 || impl_->broken) return;
  try {
    // Goodbye: this rank leaves on purpose and is not counted as lost.
    impl_->send(kBye, {}, deadlineAfter(1.0), "goodbye");
  } catch (const Error&) {
    // The store is gone already: nothing to say goodbye to.
  }
}

void TcpStoreClient::set(const std::string& key, const std::vector<char>& value) {
  checkKey(key);
  RC_CHECK_ARG(value.size() <= kMaxValueBytes,
               "a store value must have at most " << kMaxValueBytes << " bytes, got " << value.size());
  std::string fields;
  putString(fields, key);
  putBytes(fields, value.data(), value.size());
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const std::string reply = impl_->call(kSet, fields, impl_->timeout, "the store to take key '" + key + "'");
  if (!reply.empty()) impl_->malformed();
}

std::vector<char> TcpStoreClient::get(const std::string& key) {
  checkKey(key);
  std::string fields;
  putString(fields, key);
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const std::string reply = impl_->call(kGet, fields, impl_->timeout, "key '" + key + "'");
  Reader r(reply.data(), reply.size());
  const std::string value = r.bytes(kMaxValueBytes);
  if (!r.atEnd()) impl_->malformed();
  return std::vector<char>(value.begin(), value.end());
}

int64_t TcpStoreClient::add(const std::string& key, int64_t delta) {
  checkKey(key);
  std::string fields;
  putString(fields, key);
  putU64(fields, static_cast<uint64_t>(delta));
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const std::string reply = impl_->call(kAdd, fields, impl_->timeout, "the store to add to key '" + key + "'");
  Reader r(reply.data(), reply.size());
  const int64_t value = static_cast<int64_t>(r.u64());
  if (!r.atEnd()) impl_->malformed();
  return value;
}

void TcpStoreClient::wait(const std::vector<std::string>& keys, double timeoutSeconds) {
  checkKeys(keys);
  RC_CHECK_ARG(timeoutSeconds > 0 && timeoutSeconds <= 1e7,
               "TcpStore.wait: timeoutSeconds must be positive (at most 1e7), got " << timeoutSeconds);
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const auto deadline = deadlineAfter(timeoutSeconds);
  const uint32_t id = impl_->send(kWait, Impl::encodeKeys(keys), deadline, "wait request");
  Status status = kOk;
  std::string reply;
  if (impl_->receive(id, deadline, status, reply)) {
    impl_->expectOk(status, reply);
    return;
  }
  // Name the keys still missing (the store was told to drop the wait).
  std::vector<std::string> absent;
  if (!impl_->broken) {
    try {
      for (uint32_t i : impl_->missing(keys, 1.0)) absent.push_back(keys[i]);
    } catch (const Error&) {
      absent.clear();
    }
  }
  impl_->throwTimeout(timeoutSeconds, "key(s) " + quotedList(absent.empty() ? keys : absent));
}

bool TcpStoreClient::check(const std::vector<std::string>& keys) {
  checkKeys(keys);
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->missing(keys, impl_->timeout).empty();
}

std::vector<int> TcpStoreClient::lostRanks() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->parseRanks(impl_->call(kLost, {}, impl_->timeout, "the list of lost ranks"));
}

double TcpStoreClient::timeoutSeconds() const { return impl_->timeout; }

}  // namespace rc
