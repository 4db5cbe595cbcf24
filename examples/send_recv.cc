// Two-sided: a receiver posts recv(), a sender calls send() with the same tag.
// Both sides run here in one process; across hosts, run each half in its own process and give the
// sender the listener's address (peers share the key in ~/.config/dmx/auth.key: copy the file).
#include <dmx/dmx.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

static int fail(const dmx::Status& status) {
  std::fprintf(stderr, "send_recv failed: %s\n", status.to_string().c_str());
  return 1;
}

int main() {
  std::vector<unsigned char> out(1 << 20), in(out.size());
  std::mt19937 rng(std::random_device{}());
  for (auto& b : out) b = static_cast<unsigned char>(rng());

  // Receiving side: listen on any free port, accept the sender.
  dmx::Result<dmx::Context> server = dmx::Context::create();  // settings: DMX_* environment, or Options
  if (!server.ok()) return fail(server.status());
  dmx::Result<dmx::Listener> listener = server->listen("tcp://127.0.0.1:0");
  if (!listener.ok()) return fail(listener.status());

  // Sending side: connect (authenticated) to the listener's address.
  dmx::Result<dmx::Context> client = dmx::Context::create();
  if (!client.ok()) return fail(client.status());
  dmx::Result<dmx::Endpoint> tx = client->connect(listener->address());
  if (!tx.ok()) return fail(tx.status());
  dmx::Result<dmx::Endpoint> rx = listener->accept(std::chrono::seconds(10));
  if (!rx.ok()) return fail(rx.status());

  // Both calls return at once; wait() gives the outcome. Every failure names the peer and cause.
  dmx::MemRegion src{out.data(), out.size(), {dmx::MemKind::kHost, 0}};
  dmx::MemRegion dst{in.data(), in.size(), {dmx::MemKind::kHost, 0}};
  dmx::Request recv = rx->recv(dst, /*tag=*/7);
  dmx::Request send = tx->send(src, /*tag=*/7);
  for (const dmx::Request& r : {send, recv}) {
    dmx::Status s = r.wait(std::chrono::seconds(10));
    if (!s.ok()) return fail(s);
  }
  if (recv.bytes() != out.size() || std::memcmp(in.data(), out.data(), out.size()) != 0)
    return fail(dmx::Status(dmx::Code::kInternal, "received bytes differ from the sent ones"));
  std::printf("send_recv: %zu bytes sent over %s and verified\n", recv.bytes(), tx->stats().transport.c_str());
  return 0;
}
