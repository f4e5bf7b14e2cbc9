// Gloo on the CPU backend. The ranks meet through the job's TCP store (a gloo::rendezvous::Store
// adapter over TcpStoreClient, under the group's prefix), connect a full mesh of TCP pairs on the
// interface that reaches the store, and run their collectives on one thread of the communicator's
// own, in the order they were enqueued, so that the caller's thread goes on computing meanwhile.
// A failure on that thread breaks the group: the error, which names the ranks the store saw leave
// (or says that none left and a peer stalled), is thrown by the next call and by every later one.
#include "gloo_communicator.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <sstream>
#include <thread>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include "../core/dtype.h"
#include "../core/error.h"
#include "../core/tcp_store.h"

namespace rc::cpu {

namespace {

constexpr size_t kRecordCapacity = 1024;
// How long destroying a communicator waits for a collective still running.
constexpr double kJoinSeconds = 5;
// How often a waiting caller asks the store whether a rank has gone, and how long a collective may
// still take to finish after that.
constexpr double kPollSeconds = 0.5;
constexpr double kGraceSeconds = 2;

// CLOCK_MONOTONIC in milliseconds: the clock of Node's process.hrtime on Linux.
double monotonicMs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

std::chrono::milliseconds toMs(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0 + 0.5));
}

// The store as Gloo's rendezvous sees it. Calls are serialised: the client serves one request at a
// time, and the collectives' thread asks it for the lost ranks after a failure.
class TcpStoreAdapter final : public gloo::rendezvous::Store {
 public:
  TcpStoreAdapter(TcpStoreClient& client, std::mutex& mutex) : client_(client), mutex_(mutex) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    std::lock_guard<std::mutex> lock(mutex_);
    client_.set(key, data);
  }

  std::vector<char> get(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mutex_);
    return client_.get(key);
  }

  void wait(const std::vector<std::string>& keys) override {
    std::lock_guard<std::mutex> lock(mutex_);
    client_.wait(keys, client_.timeoutSeconds());
  }

  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::lock_guard<std::mutex> lock(mutex_);
    client_.wait(keys, static_cast<double>(timeout.count()) / 1000.0);
  }

 private:
  TcpStoreClient& client_;
  std::mutex& mutex_;
};

// The local address of the interface through which this host reaches host:port (a connected UDP
// socket sends nothing; the kernel only picks the route), so that the peers, which reach the store
// the same way, can reach this rank too.
std::string localAddressTowards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const int status = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (status != 0 || found == nullptr) {
    RC_THROW(code::kInvalidArgument,
             "Gloo: cannot resolve the store's host '" << host << "': " << gai_strerror(status));
  }
  std::string address;
  for (addrinfo* a = found; a != nullptr && address.empty(); a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t length = sizeof local;
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0) {
      char text[INET6_ADDRSTRLEN] = "";
      const void* raw = local.ss_family == AF_INET6
                            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
                            : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
      if (inet_ntop(local.ss_family, raw, text, sizeof text) != nullptr) address = text;
    }
    close(fd);
  }
  freeaddrinfo(found);
  if (address.empty())
    RC_THROW(code::kDistributed, "Gloo: no local interface reaches the store at " << host << ":" << port);
  return address;
}

// Element-wise reductions on types Gloo has no arithmetic for: in f32, rounded back per element.
template <uint16_t (*ToBits)(float), float (*FromBits)(uint16_t), bool Max>
void reduce16(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<uint16_t*>(c);
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) {
    const float u = FromBits(x[i]), v = FromBits(y[i]);
    out[i] = ToBits(Max ? (u > v ? u : v) : u + v);
  }
}

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

// Gloo's own element-wise sum or max of T.
template <typename T>
ReduceFn glooReduce(bool max) {
  if (max) return &gloo::max<T>;
  return &gloo::sum<T>;
}

ReduceFn reduceFunction(DType dtype, bool max) {
  switch (dtype) {
    case DType::F32: return glooReduce<float>(max);
    case DType::I32: return glooReduce<int32_t>(max);
    case DType::I64: return glooReduce<int64_t>(max);
    case DType::U8: return glooReduce<uint8_t>(max);
    case DType::BF16:
      return max ? &reduce16<floatToBf16, bf16ToFloat, true> : &reduce16<floatToBf16, bf16ToFloat, false>;
    case DType::F16:
      return max ? &reduce16<floatToHalf, halfToFloat, true> : &reduce16<floatToHalf, halfToFloat, false>;
  }
  RC_THROW(code::kInvalidArgument, "Gloo all-reduce: no reduction for " << dtypeName(dtype));
}

// Divides every element by `n` in place (integers truncate toward zero, as NCCL's average does).
void divideInPlace(const Tensor& t, int n) {
  const size_t count = static_cast<size_t>(t.numel());
  switch (t.dtype()) {
    case DType::F32:
      for (size_t i = 0; i < count; ++i) t.ptr<float>()[i] /= static_cast<float>(n);
      return;
    case DType::I32:
      for (size_t i = 0; i < count; ++i) t.ptr<int32_t>()[i] /= n;
      return;
    case DType::I64:
      for (size_t i = 0; i < count; ++i) t.ptr<int64_t>()[i] /= n;
      return;
    case DType::U8:
      for (size_t i = 0; i < count; ++i) t.ptr<uint8_t>()[i] = static_cast<uint8_t>(t.ptr<uint8_t>()[i] / n);
      return;
    case DType::BF16:
      for (size_t i = 0; i < count; ++i) {
        uint16_t& v = t.ptr<uint16_t>()[i];
        v = floatToBf16(bf16ToFloat(v) / static_cast<float>(n));
      }
      return;
    case DType::F16:
      for (size_t i = 0; i < count; ++i) {
        uint16_t& v = t.ptr<uint16_t>()[i];
        v = floatToHalf(halfToFloat(v) / static_cast<float>(n));
      }
      return;
  }
}

// "rank 1 is gone (its process exited)", "ranks 1, 3 are gone (their processes exited)".
std::string describeLost(const std::vector<int>& lost) {
  std::ostringstream out;
  out << (lost.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < lost.size(); ++i) out << (i > 0 ? ", " : "") << lost[i];
  out << (lost.size() == 1 ? " is gone (its process exited)" : " are gone (their processes exited)");
  return out.str();
}

// What the collectives' thread and the callers share; the thread keeps it alive, so that a thread
// still blocked in Gloo when the communicator is destroyed (after a failure) can finish on its own.
struct Shared {
  int rank = 0, size = 1;
  double timeoutSeconds = 0;
  std::unique_ptr<TcpStoreClient> client;  // null for a world of one
  std::mutex clientMutex;
  std::unique_ptr<gloo::rendezvous::Store> storeAdapter;
  std::unique_ptr<gloo::rendezvous::Store> prefixStore;
  std::shared_ptr<gloo::rendezvous::Context> context;

  struct Job {
    std::string op;
    uint64_t bytes = 0;
    double enqueuedMs = 0;
    std::function<void(uint32_t tag)> run;
  };
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<Job> queue;
  std::string running;  // the op in flight, empty when idle
  bool stop = false;
  bool broken = false;
  std::string error;
  std::deque<CollectiveRecord> records;
  uint32_t nextTag = 0;

  // Why the group failed, from the store's point of view: which ranks left, or that none did.
  std::string whoFailed(bool stalled) {
    if (!client) return stalled ? "the collective stalled" : "the collective failed";
    std::vector<int> lost;
    try {
      // A peer's store connection may close a moment after its Gloo pairs: ask for a while.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
      for (;;) {
        {
          std::lock_guard<std::mutex> lock(clientMutex);
          lost = client->lostRanks();
        }
        if (!lost.empty() || stalled || std::chrono::steady_clock::now() > deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    } catch (const std::exception&) {
      return "rank 0 (which serves the store) is gone";
    }
    if (!lost.empty()) return describeLost(lost);
    std::ostringstream out;
    out << "no rank exited; a peer stalled for more than " << timeoutSeconds << " s";
    return out.str();
  }

  // Whether the store reports a rank gone, or cannot be reached any more.
  bool peerGone() {
    try {
      std::lock_guard<std::mutex> lock(clientMutex);
      return !client->lostRanks().empty();
    } catch (const std::exception&) {
      return true;
    }
  }

  // Marks the group broken with a message naming the op, this rank and the cause. Call unlocked.
  void fail(const std::string& op, bool stalled, const std::string& detail) {
    std::ostringstream message;
    message << "Gloo " << op << " failed on rank " << rank << " of " << size << ": " << whoFailed(stalled);
    if (!detail.empty()) message << " [" << detail << "]";
    std::lock_guard<std::mutex> lock(mutex);
    if (broken) return;
    broken = true;
    error = message.str();
    queue.clear();
    changed.notify_all();
  }

  void loop() {
    for (;;) {
      Job job;
      uint32_t tag = 0;
      {
        std::unique_lock<std::mutex> lock(mutex);
        changed.wait(lock, [&] { return stop || !queue.empty(); });
        if (queue.empty()) return;  // stopping, nothing left
        job = std::move(queue.front());
        queue.pop_front();
        running = job.op;
        tag = nextTag++;
      }
      const double start = monotonicMs();
      std::string failure;
      bool ioError = false;
      try {
        job.run(tag);
      } catch (const gloo::IoException& e) {
        failure = e.what();
        ioError = true;
      } catch (const std::exception& e) {
        failure = e.what();
      }
      const double end = monotonicMs();
      if (!failure.empty()) {
        // Gloo reports both a closed peer and its own timeout as an I/O error; the store tells them apart.
        const bool stalled = ioError && failure.find("imed out") != std::string::npos;
        fail(job.op, stalled, failure);
      }
      std::lock_guard<std::mutex> lock(mutex);
      running.clear();
      if (failure.empty()) {
        if (records.size() == kRecordCapacity) records.pop_front();
        records.push_back(CollectiveRecord{job.op, job.bytes, job.enqueuedMs, start, end});
      }
      changed.notify_all();
    }
  }
};

class GlooCommunicator final : public Communicator {
 public:
  explicit GlooCommunicator(const CommunicatorParams& params) : shared_(std::make_shared<Shared>()) {
    Shared& s = *shared_;
    s.rank = params.rank;
    s.size = params.worldSize;
    s.timeoutSeconds = params.timeoutSeconds;
    std::string hostname = "127.0.0.1";
    if (s.size > 1) {
      s.client = std::make_unique<TcpStoreClient>(params.store, params.rank, params.timeoutSeconds);
      s.storeAdapter = std::make_unique<TcpStoreAdapter>(*s.client, s.clientMutex);
      hostname = localAddressTowards(params.store.host, params.store.port);
    } else {
      // A group of one exchanges its address with itself only.
      s.storeAdapter = std::make_unique<gloo::rendezvous::HashStore>();
    }
    s.prefixStore = std::make_unique<gloo::rendezvous::PrefixStore>(params.storePrefix, *s.storeAdapter);
    gloo::transport::tcp::attr attr;
    attr.hostname = hostname;
    try {
      auto device = gloo::transport::tcp::CreateDevice(attr);
      s.context = std::make_shared<gloo::rendezvous::Context>(s.rank, s.size);
      s.context->setTimeout(toMs(s.timeoutSeconds));
      s.context->connectFullMesh(*s.prefixStore, device);
    } catch (const std::exception& e) {
      RC_THROW(code::kDistributed, "Gloo: rank "
                                       << s.rank << " of " << s.size << " could not join the group within "
                                       << s.timeoutSeconds << " s (are all " << s.size
                                       << " ranks running, with the same MASTER_ADDR and MASTER_PORT?): " << e.what());
    }
    thread_ = std::thread([shared = shared_] { shared->loop(); });
  }

  ~GlooCommunicator() override {
    bool busy = false;
    {
      std::unique_lock<std::mutex> lock(shared_->mutex);
      shared_->queue.clear();
      shared_->stop = true;
      shared_->changed.notify_all();
      // The thread owns what a collective in flight uses (the context, the tensors), so it may
      // outlive the communicator: wait a moment for it, then let it finish (or fail) on its own.
      // After a failure nobody waits for it.
      const auto patience =
          shared_->broken ? std::chrono::milliseconds(0) : std::min(toMs(shared_->timeoutSeconds), toMs(kJoinSeconds));
      busy = !shared_->changed.wait_for(lock, patience, [&] { return shared_->running.empty(); });
    }
    if (busy) {
      thread_.detach();  // it holds `shared_` and ends when Gloo gives up
    } else {
      thread_.join();
    }
  }

  int rank() const override { return shared_->rank; }
  int size() const override { return shared_->size; }

  void allReduce(const Tensor& t, ReduceOp op) override {
    usable(t, "allReduce");
    const ReduceFn reduce = reduceFunction(t.dtype(), op == ReduceOp::Max);
    const int n = shared_->size;
    enqueue("allReduce", t.nbytes(), [t, op, reduce, n, context = shared_->context](uint32_t tag) {
      if (t.numel() > 0) {
        gloo::AllreduceOptions opts(context);
        opts.setTag(tag);
        setOutputBytes(opts, t);
        opts.setReduceFunction(reduce);
        gloo::allreduce(opts);
      }
      if (op == ReduceOp::Avg) divideInPlace(t, n);
    });
  }

  void broadcast(const Tensor& t, int root) override {
    usable(t, "broadcast");
    RC_CHECK_ARG(root >= 0 && root < shared_->size,
                 "Gloo broadcast: root " << root << " is outside a world of " << shared_->size);
    enqueue("broadcast", t.nbytes(), [t, root, context = shared_->context](uint32_t tag) {
      if (t.nbytes() == 0) return;
      gloo::BroadcastOptions opts(context);
      opts.setTag(tag);
      opts.setRoot(root);
      opts.setOutput(static_cast<uint8_t*>(t.data()), t.nbytes());
      gloo::broadcast(opts);
    });
  }

  void allGather(const Tensor& in, const Tensor& out) override {
    usable(in, "allGather");
    usable(out, "allGather");
    RC_CHECK_ARG(in.dtype() == out.dtype(),
                 "Gloo allGather: the output is " << dtypeName(out.dtype()) << ", the input " << dtypeName(in.dtype()));
    RC_CHECK_ARG(out.numel() == in.numel() * shared_->size,
                 "Gloo allGather: the output must have " << in.numel() * shared_->size << " elements (" << shared_->size
                                                         << " ranks x " << in.numel() << "), got " << out.numel());
    enqueue("allGather", in.nbytes(), [in, out, context = shared_->context](uint32_t tag) {
      if (in.nbytes() == 0) return;
      gloo::AllgatherOptions opts(context);
      opts.setTag(tag);
      opts.setInput(static_cast<uint8_t*>(in.data()), in.nbytes());
      opts.setOutput(static_cast<uint8_t*>(out.data()), out.nbytes());
      gloo::allgather(opts);
    });
  }

  void barrier() override {
    enqueue("barrier", 0, [context = shared_->context](uint32_t tag) {
      gloo::BarrierOptions opts(context);
      opts.setTag(tag);
      gloo::barrier(opts);
    });
    synchronize(shared_->timeoutSeconds);
  }

  // The CPU's ops run on the host: device work waits when the host does.
  void waitOnDevice() override { synchronize(shared_->timeoutSeconds); }

  // Waits in slices of kPollSeconds; between them asks the store whether a rank has gone, since
  // Gloo may notice a dead peer only at its own timeout. A rank seen gone (or a store that no
  // longer answers) fails the group once the collective has had kGraceSeconds more to finish: a
  // peer that did its part and exited is not a failure.
  void synchronize(double timeoutSeconds) override {
    Shared& s = *shared_;
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + toMs(timeoutSeconds);
    Clock::time_point goneSince = Clock::time_point::max();
    std::string inFlight;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(s.mutex);
        const auto until = std::min(deadline, Clock::now() + toMs(kPollSeconds));
        const bool done =
            s.changed.wait_until(lock, until, [&] { return s.broken || (s.queue.empty() && s.running.empty()); });
        if (s.broken) RC_THROW(code::kDistributed, s.error);
        if (done) return;
        inFlight = s.running.empty() ? "synchronize" : s.running;
      }
      if (Clock::now() >= deadline) break;
      if (goneSince == Clock::time_point::max() && s.client && s.peerGone()) goneSince = Clock::now();
      if (Clock::now() - goneSince > toMs(kGraceSeconds)) {
        s.fail(inFlight, false, "");
        std::lock_guard<std::mutex> lock(s.mutex);
        RC_THROW(code::kDistributed, s.error);
      }
    }
    std::ostringstream waited;
    waited << "rank " << s.rank << " waited " << timeoutSeconds << " s for it";
    s.fail(inFlight, true, waited.str());
    std::lock_guard<std::mutex> lock(s.mutex);
    RC_THROW(code::kDistributed, s.error);
  }

  std::vector<CollectiveRecord> takeRecords() override {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    std::vector<CollectiveRecord> out(shared_->records.begin(), shared_->records.end());
    shared_->records.clear();
    return out;
  }

 private:
  // The output buffer as raw elements of the tensor's size (Gloo needs only their size; the reduce
  // function knows the type).
  static void setOutputBytes(gloo::AllreduceOptions& opts, const Tensor& t) {
    const size_t n = static_cast<size_t>(t.numel());
    switch (dtypeSize(t.dtype())) {
      case 1: opts.setOutput(static_cast<uint8_t*>(t.data()), n); return;
      case 2: opts.setOutput(static_cast<uint16_t*>(t.data()), n); return;
      case 4: opts.setOutput(static_cast<uint32_t*>(t.data()), n); return;
      case 8: opts.setOutput(static_cast<uint64_t*>(t.data()), n); return;
      default: RC_THROW(code::kInvalidArgument, "Gloo all-reduce: no element size " << dtypeSize(t.dtype()));
    }
  }

  void usable(const Tensor& t, const char* op) const {
    RC_CHECK_ARG(t.defined(), "Gloo " << op << ": the tensor is required");
    RC_CHECK_ARG(t.device().type == DeviceType::Cpu, "Gloo " << op << ": " << t.describe() << " is not on the CPU");
  }

  void enqueue(const char* op, uint64_t bytes, std::function<void(uint32_t)> run) {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    if (shared_->broken) RC_THROW(code::kDistributed, shared_->error);
    shared_->queue.push_back(Shared::Job{op, bytes, monotonicMs(), std::move(run)});
    shared_->changed.notify_all();
  }

  std::shared_ptr<Shared> shared_;
  std::thread thread_;
};

}  // namespace

std::unique_ptr<Communicator> createGlooCommunicator(const CommunicatorParams& params) {
  return std::make_unique<GlooCommunicator>(params);
}

}  // namespace rc::cpu
