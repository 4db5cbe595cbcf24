// etcd v3 through its HTTP/JSON gateway (grpc-gateway, /v3/...): keys and values base64, 64-bit
// numbers as decimal strings. One connection, one call at a time (mu_), each within call_timeout_.
#include <fmt/format.h>
#include <httplib.h>
#include <openssl/evp.h>

#include <mutex>
#include <nlohmann/json.hpp>

#include "store/store.h"

namespace dmx::store {
namespace {

using nlohmann::json;

std::string b64(std::string_view s) {
  std::string out(4 * ((s.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(s.data()), static_cast<int>(s.size()));
  out.resize(n > 0 ? n : 0);
  return out;
}

Result<std::string> unb64(std::string_view s) {
  if (s.size() % 4 != 0 || s.size() > (64u << 20)) return Status(Code::kProtocol, "etcd: a malformed base64 string");
  std::string out(s.size() / 4 * 3 + 1, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()), reinterpret_cast<const unsigned char*>(s.data()),
                          static_cast<int>(s.size()));
  if (n < 0) return Status(Code::kProtocol, "etcd: a malformed base64 string");
  size_t pad = 0;
  if (!s.empty() && s.back() == '=') pad = s.size() >= 2 && s[s.size() - 2] == '=' ? 2 : 1;
  out.resize(static_cast<size_t>(n) - pad);
  return out;
}

int64_t as_int(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end()) return 0;
  try {
    if (it->is_string()) return std::stoll(it->get<std::string>());
    if (it->is_number_integer()) return it->get<int64_t>();
  } catch (...) {
  }
  return 0;
}

// The end of the range holding every key that starts with `prefix`.
std::string prefix_end(std::string prefix) {
  while (!prefix.empty()) {
    unsigned char c = static_cast<unsigned char>(prefix.back());
    if (c < 0xff) {
      prefix.back() = static_cast<char>(c + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');
}

class EtcdStore final : public Store {
 public:
  EtcdStore(std::string host, int port, std::chrono::milliseconds timeout)
      : host_(std::move(host)), port_(port), timeout_(timeout), cli_(host_, port_) {
    auto us = std::chrono::duration_cast<std::chrono::microseconds>(timeout_).count();
    cli_.set_connection_timeout(us / 1'000'000, us % 1'000'000);
    cli_.set_read_timeout(us / 1'000'000, us % 1'000'000);
    cli_.set_write_timeout(us / 1'000'000, us % 1'000'000);
    cli_.set_keep_alive(true);
  }

  std::string describe() const override { return fmt::format("etcd http://{}:{}", host_, port_); }

  Result<int64_t> grant(std::chrono::seconds ttl) override {
    DMX_ASSIGN_OR_RETURN(json r, call("/v3/lease/grant", json{{"TTL", ttl.count()}}));
    int64_t id = as_int(r, "ID");
    if (id == 0) return Status(Code::kProtocol, fmt::format("{}: lease grant answered no lease id", describe()));
    return id;
  }

  Status keepalive(int64_t lease) override {
    DMX_ASSIGN_OR_RETURN(json r, call("/v3/lease/keepalive", json{{"ID", std::to_string(lease)}}));
    const json& res = r.contains("result") ? r["result"] : r;
    if (as_int(res, "TTL") <= 0)
      return Status(Code::kNotFound, fmt::format("{}: lease {:x} has ended", describe(), lease));
    return {};
  }

  Status put(const std::string& key, const std::string& value, int64_t lease) override {
    json body{{"key", b64(key)}, {"value", b64(value)}};
    if (lease != 0) body["lease"] = std::to_string(lease);
    auto r = call("/v3/kv/put", body);
    return r.ok() ? Status() : r.status();
  }

  Result<std::optional<KeyValue>> get(const std::string& key) override {
    DMX_ASSIGN_OR_RETURN(json r, call("/v3/kv/range", json{{"key", b64(key)}}));
    DMX_ASSIGN_OR_RETURN(auto kvs, parse_kvs(r, 1));
    if (kvs.empty()) return std::optional<KeyValue>();
    return std::optional<KeyValue>(std::move(kvs.front()));
  }

  Result<std::vector<KeyValue>> list(const std::string& prefix, size_t limit) override {
    DMX_ASSIGN_OR_RETURN(json r, call("/v3/kv/range", json{{"key", b64(prefix)},
                                                          {"range_end", b64(prefix_end(prefix))},
                                                          {"limit", std::to_string(limit)}}));
    return parse_kvs(r, limit);
  }

  // The cluster's revision after a put of `key`: it grows with every write anywhere in the
  // cluster, so a later registration of the same name always gets a larger number.
  Result<uint64_t> next_epoch(const std::string& key) override {
    DMX_ASSIGN_OR_RETURN(json r, call("/v3/kv/put", json{{"key", b64(key)}, {"value", b64("epoch")}}));
    int64_t rev = r.contains("header") ? as_int(r["header"], "revision") : 0;
    if (rev <= 0) return Status(Code::kProtocol, fmt::format("{}: a put answered no revision", describe()));
    return static_cast<uint64_t>(rev);
  }

  Status remove(const std::string& key) override {
    auto r = call("/v3/kv/deleterange", json{{"key", b64(key)}});
    return r.ok() ? Status() : r.status();
  }

 private:
  Result<json> call(const char* path, const json& body) {
    std::lock_guard lock(mu_);
    auto res = cli_.Post(path, body.dump(), "application/json");
    if (!res)
      return Status(Code::kUnavailable, fmt::format("{}: POST {} failed: {} (within {} ms)", describe(), path,
                                                    httplib::to_string(res.error()), timeout_.count()));
    if (res->status != 200) {
      std::string text = res->body.substr(0, 200);
      Code code = res->status >= 500 ? Code::kUnavailable : Code::kProtocol;
      if (text.find("requested lease not found") != std::string::npos) code = Code::kNotFound;
      return Status(code, fmt::format("{}: POST {}: HTTP {}: {}", describe(), path, res->status, text));
    }
    json j = json::parse(res->body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object())
      return Status(Code::kProtocol, fmt::format("{}: POST {}: the answer is not a JSON object", describe(), path));
    if (j.contains("error"))  // a streaming call (keepalive) reports errors in the body
      return Status(j.dump().find("lease not found") != std::string::npos ? Code::kNotFound : Code::kUnavailable,
                    fmt::format("{}: POST {}: {}", describe(), path, j["error"].dump().substr(0, 200)));
    return j;
  }

  Result<std::vector<KeyValue>> parse_kvs(const json& r, size_t limit) {
    std::vector<KeyValue> out;
    auto it = r.find("kvs");
    if (it == r.end()) return out;
    if (!it->is_array()) return Status(Code::kProtocol, fmt::format("{}: range: kvs is not a list", describe()));
    for (const json& kv : *it) {
      if (out.size() >= limit) break;
      if (!kv.is_object() || !kv.contains("key")) continue;
      KeyValue e;
      DMX_ASSIGN_OR_RETURN(e.key, unb64(kv["key"].is_string() ? kv["key"].get<std::string>() : ""));
      if (kv.contains("value") && kv["value"].is_string()) {
        DMX_ASSIGN_OR_RETURN(e.value, unb64(kv["value"].get<std::string>()));
      }
      e.lease = as_int(kv, "lease");
      out.push_back(std::move(e));
    }
    return out;
  }

  const std::string host_;
  const int port_;
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;  // guards cli_: one call at a time
  httplib::Client cli_;
};

}  // namespace

std::unique_ptr<Store> make_etcd_store(const std::string& host, int port, std::chrono::milliseconds call_timeout) {
  return std::make_unique<EtcdStore>(host, port, call_timeout);
}

}  // namespace dmx::store
