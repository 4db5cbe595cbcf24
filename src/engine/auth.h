// Peer authentication: challenge-response over a shared secret (HMAC-SHA256, OpenSSL).
//
// The secret comes from the auth_key setting (DMX_AUTH_KEY), else from a key file
// (auth_key_file; default $XDG_CONFIG_HOME/dmx/auth.key, else <home>/.config/dmx/auth.key with
// <home> from $HOME or the passwd entry — never a shared place such as /tmp: with no home, it is
// refused), which is created with 32 random bytes and mode 0600 on first use — so two processes of
// one user on one host work with no set-up; a key file named by auth_key_file must exist (unless
// auth_key_create). Refused, with the path and why: a key file that is not a regular file (a FIFO
// would block), not ours or that others can access; for the default file, a symbolic link, a dmx
// directory that is a link, not ours or writable by others, a config directory others may write.
// insecure=true turns authentication off; both peers must agree.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/config.h"
#include "wire/handshake.h"

namespace dmx {

struct AuthKey {
  bool insecure = false;
  std::vector<unsigned char> secret;
  std::string source;  // "setting auth_key", "file /root/.config/dmx/auth.key", "insecure"
};

Result<AuthKey> load_auth_key(const Config& config);

// HMAC-SHA256(secret, label || client nonce || server nonce || session || index).
wire::Proof make_proof(const AuthKey& key, std::string_view label, const wire::Nonce& client,
                       const wire::Nonce& server, uint64_t session, uint16_t index = 0);
// Constant time in the contents (not in the sizes, which are public): every proof is compared so.
bool same_bytes(std::span<const std::byte> a, std::span<const std::byte> b);
bool proofs_equal(const wire::Proof& a, const wire::Proof& b);

}  // namespace dmx
