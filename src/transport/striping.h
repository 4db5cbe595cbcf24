// How the chunks that go inline spread over an endpoint's streams: the business of the transport
// that gives the streams (Gives::kStreams: tcp), which makes one per endpoint of more than one
// stream (Transport::striping). The endpoint cuts transfers into chunks of chunk(); each stream
// pulls the next chunk when pulls() lets it, and the endpoint reports which stream took (took) and
// wrote (wrote) each.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "dmx/memory.h"

namespace dmx {

struct StripingSetup {
  size_t streams = 0;  // the endpoint's, the control stream 0 included
  uint64_t chunk_size = 0, host_chunk_size = 0;
  // Makes stream i pull (it may be parked). Called from pulls() on stream threads and from
  // wake_for() under the endpoint's lock: it must not take that lock. Outlives the striping.
  std::function<void(int)> wake;
  // wrote() reports the peer's acknowledgement of a chunk, not its write (several links): the
  // striping may then time each stream's completions.
  bool acked = false;
  // Room for streams added later (up(): a reconnect's new streams); 0: `streams`. Those beyond
  // `streams` start down.
  size_t capacity = 0;
};

class Striping {
 public:
  virtual ~Striping() = default;
  // The size of the chunks of a transfer of `total` bytes of `where`.
  virtual uint64_t chunk(uint64_t total, const MemSpec& where) const = 0;
  // Whether `stream` takes the next chunk now; false leaves it to another stream, woken if need
  // be. Any stream's thread, without the endpoint's lock: it runs on every pull.
  virtual bool pulls(int stream) = 0;
  // Under the endpoint's lock: `stream` took a chunk; wrote one it took.
  virtual void took(int stream) = 0;
  virtual void wrote(int stream) = 0;
  // Under the endpoint's lock: `stream` is gone for good (one of several links died); the others
  // take what it would have.
  virtual void down(int stream) { (void)stream; }
  // Under the endpoint's lock: `stream` (below the setup's capacity) joined; it takes chunks now.
  virtual void up(int stream) { (void)stream; }
  // Under the endpoint's lock: a transfer of `total` bytes of `where` with `remaining` bytes to
  // send was queued; wakes the streams that should pull it.
  virtual void wake_for(uint64_t total, uint64_t remaining, const MemSpec& where) = 0;
};

}  // namespace dmx
