// The engine's side of the store (docs/cluster.md): opening it from the settings, connecting by
// name. Context::publish/lookup/cluster live in cluster.cc too.
#pragma once

#include <memory>
#include <string>

#include "core/config.h"
#include "engine/auth.h"
#include "store/directory.h"

namespace dmx {

class ContextImpl;
class EndpointImpl;

// The directory the `store` setting names; nullptr when it is empty. Contacts no store.
Result<std::shared_ptr<store::Directory>> open_directory(const Config& config, const AuthKey& auth);

bool is_name_address(const std::string& address);  // "dmx://..."
// Looks "dmx://job/name" up and connects to it, checking the name and epoch its HELLO gives.
Result<std::shared_ptr<EndpointImpl>> connect_by_name(const std::shared_ptr<ContextImpl>& ctx,
                                                      const std::string& address);

}  // namespace dmx
