// The devmem transport: device sources on a dedicated data socket whose payload the NIC writes
// into (and reads from) GPU memory (devmem_path.h). For peers on different hosts; between two
// processes of one host only when either side is forced to it (transport=devmem).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "core/sys.h"
#include "transport/transport.h"

namespace dmx {

// Makes the path over an authenticated data socket. Tests pass one that builds the path over the
// socket-pair double (tests/devmem/socket_double.h); this side then offers devmem whatever the
// NIC says (the reason says "test double").
using DevmemPathFactory =
    std::function<Result<std::unique_ptr<PayloadPath>>(UniqueFd data_socket, const Config& config,
                                                       const std::string& peer)>;

// Without a factory: the production path on CUDA device devmem_gpu (make_devmem_path).
std::shared_ptr<Transport> make_devmem_transport(DevmemPathFactory factory = nullptr);

}  // namespace dmx
