#include "rpc/grpc/baseline.h"

#ifdef DMX_RPC_HAVE_GRPC
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "rpc/cuda/device.h"
#include "rpc/service.h"
#include "splitrpc_bench.grpc.pb.h"

namespace dmx::rpc::grpcb {
namespace {

// The work memory of one request in flight: input and output in the server's memory kind.
struct Workspace {
  Buffer in, out;
  std::unique_ptr<device::Launcher> launcher;
};

class Service final : public dmxrpc::Infer::Service {
 public:
  Service(MemSpec mem, uint32_t slot_size) : mem_(mem), slot_size_(slot_size) {}

  ::grpc::Status Call(::grpc::ServerContext*, const dmxrpc::Request* req, dmxrpc::Response* resp) override {
    const std::string& p = req->payload();
    if (req->method() != 1 && req->method() != 2) return {::grpc::StatusCode::INVALID_ARGUMENT, "unknown method"};
    Method m = static_cast<Method>(req->method());
    if (p.size() > slot_size_) return {::grpc::StatusCode::INVALID_ARGUMENT, "payload larger than a slot"};
    Result<uint32_t> out_len = response_size(m, static_cast<uint32_t>(p.size()));
    if (!out_len.ok()) return {::grpc::StatusCode::INVALID_ARGUMENT, out_len.status().message()};
    Result<std::unique_ptr<Workspace>> ws = take();
    if (!ws.ok()) return {::grpc::StatusCode::UNAVAILABLE, ws.status().to_string()};
    Status s = work(**ws, m, p, *out_len, resp->mutable_payload());
    give(std::move(*ws));
    if (!s.ok()) return {::grpc::StatusCode::INTERNAL, s.to_string()};
    return ::grpc::Status::OK;
  }

 private:
  // Host-centric: payload -> work memory, compute there, work memory -> response.
  Status work(Workspace& w, Method m, const std::string& p, uint32_t out_len, std::string* out) {
    const MemSpec host{};
    if (!p.empty())
      DMX_RETURN_IF_ERROR(copy_memory(w.in.region().sub(0, p.size()), {const_cast<char*>(p.data()), p.size(), host}));
    if (w.launcher) {
      device::Item it{w.in.data(), w.out.data(), static_cast<uint32_t>(p.size()), static_cast<uint8_t>(m)};
      DMX_RETURN_IF_ERROR(w.launcher->run(&it, 1, std::chrono::seconds(10)));
    } else {
      run_host(m, static_cast<const unsigned char*>(w.in.data()), p.size(), static_cast<unsigned char*>(w.out.data()));
    }
    out->resize(out_len);
    if (out_len > 0) DMX_RETURN_IF_ERROR(copy_memory({out->data(), out_len, host}, w.out.region().sub(0, out_len)));
    return Status();
  }

  Result<std::unique_ptr<Workspace>> take() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        auto w = std::move(free_.back());
        free_.pop_back();
        return w;
      }
    }
    auto w = std::make_unique<Workspace>();
    DMX_ASSIGN_OR_RETURN(w->in, Buffer::allocate(mem_, slot_size_));
    DMX_ASSIGN_OR_RETURN(w->out, Buffer::allocate(mem_, slot_size_));
    if (mem_.kind == MemKind::kCuda) {
      DMX_ASSIGN_OR_RETURN(w->launcher, device::Launcher::create(mem_.device));
    }
    return w;
  }
  void give(std::unique_ptr<Workspace> w) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(std::move(w));
  }

  MemSpec mem_;
  uint32_t slot_size_;
  std::mutex mu_;  // guards free_
  std::vector<std::unique_ptr<Workspace>> free_;
};

class ServerImpl final : public Server {
 public:
  ServerImpl(MemSpec mem, uint32_t slot_size) : service_(mem, slot_size) {}
  ~ServerImpl() override { stop(); }
  Status start(const std::string& host_port, int threads) {
    ::grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort(host_port, ::grpc::InsecureServerCredentials(), &port);
    b.RegisterService(&service_);
    b.SetMaxReceiveMessageSize(128 << 20);
    b.SetMaxSendMessageSize(128 << 20);
    b.SetSyncServerOption(::grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 1);
    b.SetSyncServerOption(::grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, std::max(threads, 1));
    server_ = b.BuildAndStart();
    if (!server_ || port == 0) return Status(Code::kIo, "grpc: could not listen on " + host_port);
    target_ = host_port.substr(0, host_port.rfind(':')) + ":" + std::to_string(port);
    return Status();
  }
  std::string target() const override { return target_; }
  void stop() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_.reset();
  }

 private:
  Service service_;
  std::unique_ptr<::grpc::Server> server_;
  std::string target_;
};

class ClientImpl final : public Client {
 public:
  explicit ClientImpl(const std::string& target) {
    ::grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(128 << 20);
    args.SetMaxSendMessageSize(128 << 20);
    stub_ = dmxrpc::Infer::NewStub(::grpc::CreateCustomChannel(target, ::grpc::InsecureChannelCredentials(), args));
  }
  Result<size_t> call(Method method, const void* req, size_t len, void* resp, size_t cap,
                      Duration timeout) override {
    dmxrpc::Request rq;
    rq.set_method(static_cast<uint32_t>(method));
    rq.set_payload(req, len);
    dmxrpc::Response rs;
    ::grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::duration_cast<std::chrono::system_clock::duration>(
                         std::min<Duration>(timeout, std::chrono::hours(24))));
    ::grpc::Status s = stub_->Call(&ctx, rq, &rs);
    if (!s.ok()) return Status(Code::kPeerFailed, "grpc: " + s.error_message());
    if (rs.payload().size() > cap) return Status(Code::kTruncated, "grpc: response larger than the buffer");
    std::memcpy(resp, rs.payload().data(), rs.payload().size());
    return rs.payload().size();
  }

 private:
  std::unique_ptr<dmxrpc::Infer::Stub> stub_;
};

}  // namespace

Status available() { return Status(); }

Result<std::unique_ptr<Server>> Server::start(const std::string& host_port, MemSpec mem, uint32_t slot_size,
                                              int threads) {
  DMX_RETURN_IF_ERROR(mem_available(mem));
  auto s = std::make_unique<ServerImpl>(mem, slot_size);
  DMX_RETURN_IF_ERROR(s->start(host_port, threads));
  return std::unique_ptr<Server>(std::move(s));
}

Result<std::unique_ptr<Client>> Client::connect(const std::string& target) {
  return std::unique_ptr<Client>(std::make_unique<ClientImpl>(target));
}

}  // namespace dmx::rpc::grpcb

#else  // without gRPC: say why
#include "grpc_reason.h"

namespace dmx::rpc::grpcb {

Status available() { return Status(Code::kUnavailable, DMX_RPC_GRPC_REASON); }
Result<std::unique_ptr<Server>> Server::start(const std::string&, MemSpec, uint32_t, int) { return available(); }
Result<std::unique_ptr<Client>> Client::connect(const std::string&) { return available(); }

}  // namespace dmx::rpc::grpcb

#endif
