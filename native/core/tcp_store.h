// The rendezvous key-value store (the role of PyTorch's TCPStore): rank 0 serves it on a thread of
// its own, every rank (rank 0 included) connects as a client. Clients must present the job's token
// first; anything else is disconnected before it can read or write a key. The server remembers
// which rank each client announced, so that after a failure a rank can ask which peers have gone.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace rc {

// Where the store listens and what clients must present.
struct TcpStoreAddress {
  std::string host;   // an address or host name; the server binds to it only
  int port = 0;       // 0 for the server: any free port (read it back with port())
  std::string token;  // the job's shared secret; may be empty (then any client is accepted)
};

class TcpStoreServer {
 public:
  // Binds and starts serving on its own thread; throws naming the address when it cannot be bound
  // (code::kInvalidArgument: not an address of this machine; code::kDistributed: the port is taken).
  explicit TcpStoreServer(const TcpStoreAddress& address);
  ~TcpStoreServer();  // stops the thread and closes every connection
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class TcpStoreClient {
 public:
  // Connects (retrying until timeoutSeconds: rank 0 may start later), presents the token and
  // announces `rank`; throws naming host:port when no store answers in time or the token is refused.
  TcpStoreClient(const TcpStoreAddress& address, int rank, double timeoutSeconds);
  ~TcpStoreClient();
  TcpStoreClient(const TcpStoreClient&) = delete;
  TcpStoreClient& operator=(const TcpStoreClient&) = delete;

  void set(const std::string& key, const std::vector<char>& value);
  // Waits until `key` exists (up to the client's timeout) and returns its value.
  std::vector<char> get(const std::string& key);
  // Adds `delta` to the integer at `key` (0 when absent) and returns the new value.
  int64_t add(const std::string& key, int64_t delta);
  // Waits until every key exists; throws naming the missing keys after `timeoutSeconds`.
  void wait(const std::vector<std::string>& keys, double timeoutSeconds);
  // Whether every key exists now.
  bool check(const std::vector<std::string>& keys);
  // Ranks whose client connection closed without saying goodbye (a process that died).
  std::vector<int> lostRanks();
  double timeoutSeconds() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rc
