#include "tcp_store.h"

#include <string>
#include <vector>

#include "../core/error.h"
#include "addon_data.h"
#include "convert.h"

namespace rc::napi {

namespace {

TcpStoreAddress getAddress(const Napi::Object& o) {
  TcpStoreAddress a;
  a.host = getString(o, "host");
  a.port = static_cast<int>(getInt(o, "port"));
  a.token = has(o, "token") ? getString(o, "token") : std::string();
  return a;
}

std::vector<std::string> getKeys(const Napi::Object& o) {
  Napi::Value keys = o.Get("keys");
  RC_CHECK_ARG(keys.IsArray(), "option 'keys' must be an array of strings");
  Napi::Array array = keys.As<Napi::Array>();
  std::vector<std::string> out;
  for (uint32_t i = 0; i < array.Length(); ++i) {
    Napi::Value key = array.Get(i);
    RC_CHECK_ARG(key.IsString(), "option 'keys'[" << i << "] must be a string");
    out.push_back(key.As<Napi::String>().Utf8Value());
  }
  return out;
}

std::vector<char> getBytes(const Napi::Object& o, const char* key) {
  Napi::Value v = o.Get(key);
  RC_CHECK_ARG(v.IsTypedArray() && v.As<Napi::TypedArray>().TypedArrayType() == napi_uint8_array,
               "option '" << key << "' must be a Uint8Array");
  Napi::Uint8Array bytes = v.As<Napi::Uint8Array>();
  const char* data = reinterpret_cast<const char*>(bytes.Data());
  return std::vector<char>(data, data + bytes.ByteLength());
}

}  // namespace

// ---- TcpStoreServer ------------------------------------------------------------------------------

Napi::Function TcpStoreServerWrap::Init(Napi::Env env) {
  return DefineClass(
      env, "TcpStoreServer",
      {InstanceAccessor<&TcpStoreServerWrap::Port>("port"), InstanceMethod<&TcpStoreServerWrap::Close>("close")});
}

// new TcpStoreServer({ host, port, token? })
TcpStoreServerWrap::TcpStoreServerWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<TcpStoreServerWrap>(info) {
  guarded(info.Env(), [&] {
    server_ = std::make_unique<TcpStoreServer>(getAddress(optionsArg(info, "TcpStoreServer")));
    port_ = server_->port();
  });
}

Napi::Value TcpStoreServerWrap::Port(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), port_); }

// Stops serving (joins the thread, closes every connection); a second call does nothing.
Napi::Value TcpStoreServerWrap::Close(const Napi::CallbackInfo& info) {
  server_.reset();
  return info.Env().Undefined();
}

// ---- TcpStore ------------------------------------------------------------------------------------

Napi::Function TcpStoreWrap::Init(Napi::Env env) {
  return DefineClass(
      env, "TcpStore",
      {InstanceMethod<&TcpStoreWrap::Set>("set"), InstanceMethod<&TcpStoreWrap::Get>("get"),
       InstanceMethod<&TcpStoreWrap::Add>("add"), InstanceMethod<&TcpStoreWrap::Wait>("wait"),
       InstanceMethod<&TcpStoreWrap::Check>("check"), InstanceMethod<&TcpStoreWrap::LostRanks>("lostRanks"),
       InstanceMethod<&TcpStoreWrap::Close>("close")});
}

// new TcpStore({ host, port, token?, rank, timeoutSeconds })
TcpStoreWrap::TcpStoreWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<TcpStoreWrap>(info) {
  guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "TcpStore");
    const TcpStoreAddress address = getAddress(o);
    const int64_t rank = getInt(o, "rank");
    RC_CHECK_ARG(rank >= 0 && rank <= INT32_MAX, "TcpStore: rank must be a non-negative integer, got " << rank);
    client_ = std::make_shared<TcpStoreClient>(address, static_cast<int>(rank), getNumber(o, "timeoutSeconds"));
  });
}

TcpStoreClient& TcpStoreWrap::client() {
  if (!client_) RC_THROW(code::kDisposed, "TcpStore was closed and cannot be used");
  return *client_;
}

// set({ key, value: Uint8Array })
Napi::Value TcpStoreWrap::Set(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "TcpStore.set");
    client().set(getString(o, "key"), getBytes(o, "value"));
    return info.Env().Undefined();
  });
}

// get({ key }) -> Uint8Array, once the key exists (up to the client's timeout).
Napi::Value TcpStoreWrap::Get(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "TcpStore.get");
    const std::vector<char> value = client().get(getString(o, "key"));
    Napi::Uint8Array out = Napi::Uint8Array::New(info.Env(), value.size());
    std::copy(value.begin(), value.end(), reinterpret_cast<char*>(out.Data()));
    return Napi::Value(out);
  });
}

// add({ key, delta }) -> the new value.
Napi::Value TcpStoreWrap::Add(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "TcpStore.add");
    const int64_t value = client().add(getString(o, "key"), getInt(o, "delta"));
    return Napi::Value(Napi::Number::New(info.Env(), static_cast<double>(value)));
  });
}

// wait({ keys, timeoutSeconds? }): the client's timeout when absent.
Napi::Value TcpStoreWrap::Wait(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "TcpStore.wait");
    TcpStoreClient& c = client();
    c.wait(getKeys(o), getNumber(o, "timeoutSeconds", c.timeoutSeconds()));
    return info.Env().Undefined();
  });
}

// check({ keys }) -> whether every key exists now.
Napi::Value TcpStoreWrap::Check(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    Napi::Object o = optionsArg(info, "TcpStore.check");
    return Napi::Value(Napi::Boolean::New(info.Env(), client().check(getKeys(o))));
  });
}

// lostRanks() -> the ranks whose connection closed without a goodbye, ascending.
Napi::Value TcpStoreWrap::LostRanks(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&] {
    const std::vector<int> ranks = client().lostRanks();
    Napi::Array out = Napi::Array::New(info.Env(), ranks.size());
    for (size_t i = 0; i < ranks.size(); ++i) out.Set(static_cast<uint32_t>(i), ranks[i]);
    return Napi::Value(out);
  });
}

// Says goodbye and closes the connection (native holders of the client keep it until they let go);
// a second call does nothing.
Napi::Value TcpStoreWrap::Close(const Napi::CallbackInfo& info) {
  client_.reset();
  return info.Env().Undefined();
}

void RegisterTcpStore(Napi::Env env, Napi::Object exports) {
  Napi::Function store = TcpStoreWrap::Init(env);
  addonData(env).tcpStoreConstructor = Napi::Persistent(store);
  exports.Set("TcpStore", store);
  exports.Set("TcpStoreServer", TcpStoreServerWrap::Init(env));
}

std::shared_ptr<TcpStoreClient> tcpStoreClientOf(const Napi::Object& o, const char* key) {
  Napi::Value v = o.Get(key);
  RC_CHECK_ARG(v.IsObject() && v.As<Napi::Object>().InstanceOf(addonData(v.Env()).tcpStoreConstructor.Value()),
               "option '" << key << "' must be a native TcpStore");
  TcpStoreWrap* wrap = TcpStoreWrap::Unwrap(v.As<Napi::Object>());
  if (!wrap->client_) RC_THROW(code::kDisposed, "option '" << key << "': the TcpStore was closed");
  return wrap->client_;
}

}  // namespace rc::napi
