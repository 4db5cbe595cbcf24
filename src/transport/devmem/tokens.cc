#include "transport/devmem/tokens.h"

#include <fmt/format.h>

#include "core/log.h"
#include "core/sys.h"

namespace dmx::devmem {

std::vector<std::vector<abi::DmabufToken>> plan_dontneed(const std::vector<uint32_t>& tokens) {
  std::vector<std::vector<abi::DmabufToken>> calls;
  std::vector<abi::DmabufToken> cur;
  size_t frags = 0;
  for (uint32_t t : tokens) {
    bool merged = false;
    if (!cur.empty()) {
      auto& last = cur.back();
      // Merge only when the range stays representable (no u32 wrap) and the call's fragment
      // budget allows one more.
      if (uint64_t{last.token_start} + last.token_count == t && frags < abi::kMaxDontneedFrags) {
        ++last.token_count;
        merged = true;
      }
    }
    if (!merged) {
      if (cur.size() == abi::kMaxDontneedTokens || frags == abi::kMaxDontneedFrags) {
        calls.push_back(std::move(cur));
        cur.clear();
        frags = 0;
      }
      cur.push_back({t, 1});
    }
    ++frags;
  }
  if (!cur.empty()) calls.push_back(std::move(cur));
  return calls;
}

Status return_tokens(KernelSocket& sock, const std::vector<uint32_t>& tokens, TokenStats* stats) {
  Status first;
  for (const auto& call : plan_dontneed(tokens)) {
    uint64_t want = 0;
    for (const auto& r : call) want += r.token_count;
    int ret = sock.setsockopt(SOL_SOCKET, abi::kSoDevmemDontneed, call.data(),
                              static_cast<socklen_t>(call.size() * sizeof(abi::DmabufToken)));
    ++stats->calls;
    if (ret < 0) {
      if (first.ok())
        first = errno_status(fmt::format("setsockopt(SO_DEVMEM_DONTNEED, {} ranges, {} frags)", call.size(), want), -ret);
      continue;
    }
    stats->returned += static_cast<uint64_t>(ret);
    if (static_cast<uint64_t>(ret) < want) {
      stats->unknown += want - static_cast<uint64_t>(ret);
      DMX_LOG_WARN("devmem: SO_DEVMEM_DONTNEED freed {} of {} fragments (the kernel did not know the rest)", ret, want);
    }
  }
  return first;
}

}  // namespace dmx::devmem
