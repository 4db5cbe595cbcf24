// Built without cpp-httplib (DMX_ENABLE_HTTPLIB=OFF): the etcd store is unavailable, with why.
#include "store/store.h"

namespace dmx::store {
namespace {
class NoEtcd final : public Store {
 public:
  NoEtcd(std::string host, int port) : where_(host + ":" + std::to_string(port)) {}
  std::string describe() const override { return "etcd http://" + where_; }
  Status no() const {
    return Status(Code::kUnavailable, "etcd store: unavailable: this build has no cpp-httplib (DMX_ENABLE_HTTPLIB=OFF; "
                                      "install libcpp-httplib-dev)");
  }
  Result<int64_t> grant(std::chrono::seconds) override { return no(); }
  Status keepalive(int64_t) override { return no(); }
  Status put(const std::string&, const std::string&, int64_t) override { return no(); }
  Result<std::optional<KeyValue>> get(const std::string&) override { return no(); }
  Result<std::vector<KeyValue>> list(const std::string&, size_t) override { return no(); }
  Result<uint64_t> next_epoch(const std::string&) override { return no(); }
  Status remove(const std::string&) override { return no(); }

 private:
  std::string where_;
};
}  // namespace

std::unique_ptr<Store> make_etcd_store(const std::string& host, int port, std::chrono::milliseconds) {
  return std::make_unique<NoEtcd>(host, port);
}
}  // namespace dmx::store
