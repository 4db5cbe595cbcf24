// One-sided: the target registers memory and hands its RemoteRegion to the initiator, which writes
// into it with a notification (the target learns when the data has landed) and reads it back.
#include <dmx/dmx.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

static int fail(const dmx::Status& status) {
  std::fprintf(stderr, "write_read failed: %s\n", status.to_string().c_str());
  return 1;
}

int main() {
  using std::chrono::seconds;
  const dmx::MemSpec host{dmx::MemKind::kHost, 0};
  std::vector<unsigned char> out(256 << 10), target(out.size()), back(out.size());
  std::mt19937 rng(std::random_device{}());
  for (auto& b : out) b = static_cast<unsigned char>(rng());

  // Target side: listens and registers the memory peers may write into and read from.
  dmx::Result<dmx::Context> server = dmx::Context::create();
  if (!server.ok()) return fail(server.status());
  dmx::Result<dmx::Listener> listener = server->listen("tcp://127.0.0.1:0");
  if (!listener.ok()) return fail(listener.status());
  dmx::Result<dmx::Registration> reg = server->register_memory({target.data(), target.size(), host});
  if (!reg.ok()) return fail(reg.status());

  // Initiator side: connects; the target sends it the region's 16-byte description.
  dmx::Result<dmx::Context> client = dmx::Context::create();
  if (!client.ok()) return fail(client.status());
  dmx::Result<dmx::Endpoint> ini = client->connect(listener->address());
  if (!ini.ok()) return fail(ini.status());
  dmx::Result<dmx::Endpoint> tgt = listener->accept(seconds(10));
  if (!tgt.ok()) return fail(tgt.status());
  std::vector<unsigned char> desc = reg->remote().serialize(), got(desc.size());
  dmx::Request desc_in = ini->recv({got.data(), got.size(), host}, /*tag=*/1);
  if (dmx::Status s = tgt->send({desc.data(), desc.size(), host}, /*tag=*/1).wait(seconds(10)); !s.ok()) return fail(s);
  if (dmx::Status s = desc_in.wait(seconds(10)); !s.ok()) return fail(s);
  dmx::Result<dmx::RemoteRegion> remote = dmx::RemoteRegion::parse(got.data(), got.size());
  if (!remote.ok()) return fail(remote.status());

  // Write with a notification: the target's next_notification() says the bytes have landed.
  dmx::OpOptions notify;
  notify.notify = true;
  notify.notify_value = 42;
  if (dmx::Status s = ini->write({out.data(), out.size(), host}, *remote, 0, notify).wait(seconds(10)); !s.ok())
    return fail(s);
  dmx::Result<dmx::Notification> note = tgt->next_notification(seconds(10));
  if (!note.ok()) return fail(note.status());
  if (note->value != 42 || note->length != out.size() || std::memcmp(target.data(), out.data(), out.size()) != 0)
    return fail(dmx::Status(dmx::Code::kInternal, "the written bytes or the notification differ"));

  // Read the region back into a third buffer.
  if (dmx::Status s = ini->read({back.data(), back.size(), host}, *remote, 0).wait(seconds(10)); !s.ok())
    return fail(s);
  if (std::memcmp(back.data(), out.data(), out.size()) != 0)
    return fail(dmx::Status(dmx::Code::kInternal, "the bytes read back differ from the written ones"));
  std::printf("write_read: wrote %zu bytes (notification %llu), read them back, verified\n", out.size(),
              static_cast<unsigned long long>(note->value));
  return 0;
}
