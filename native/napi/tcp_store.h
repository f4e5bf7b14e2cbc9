// The JavaScript classes of the rendezvous store (native/core/tcp_store.h): TcpStoreServer, which
// rank 0 keeps alive while the job runs, and TcpStore, every rank's client.
#pragma once

#include <napi.h>

#include <memory>

#include "../core/tcp_store.h"

namespace rc::napi {

class TcpStoreServerWrap : public Napi::ObjectWrap<TcpStoreServerWrap> {
 public:
  static Napi::Function Init(Napi::Env env);
  explicit TcpStoreServerWrap(const Napi::CallbackInfo& info);

 private:
  Napi::Value Port(const Napi::CallbackInfo& info);
  Napi::Value Close(const Napi::CallbackInfo& info);
  std::unique_ptr<TcpStoreServer> server_;
  int port_ = 0;
};

class TcpStoreWrap : public Napi::ObjectWrap<TcpStoreWrap> {
 public:
  static Napi::Function Init(Napi::Env env);
  explicit TcpStoreWrap(const Napi::CallbackInfo& info);

 private:
  Napi::Value Set(const Napi::CallbackInfo& info);
  Napi::Value Get(const Napi::CallbackInfo& info);
  Napi::Value Add(const Napi::CallbackInfo& info);
  Napi::Value Wait(const Napi::CallbackInfo& info);
  Napi::Value Check(const Napi::CallbackInfo& info);
  Napi::Value LostRanks(const Napi::CallbackInfo& info);
  Napi::Value Close(const Napi::CallbackInfo& info);
  TcpStoreClient& client();
  // Shared, so that native code that keeps using the connection (a communicator's rendezvous) can
  // hold it beyond this object (see tcpStoreClientOf).
  std::shared_ptr<TcpStoreClient> client_;

  friend std::shared_ptr<TcpStoreClient> tcpStoreClientOf(const Napi::Object& o, const char* key);
};

// Registers both classes on `exports` and remembers TcpStore's constructor (for tcpStoreClientOf).
void RegisterTcpStore(Napi::Env env, Napi::Object exports);

// The client of option `key`, a TcpStore object (throws naming the option otherwise, or when it was
// closed).
std::shared_ptr<TcpStoreClient> tcpStoreClientOf(const Napi::Object& o, const char* key);

}  // namespace rc::napi
