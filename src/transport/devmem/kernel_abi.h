// The Linux kernel ABI of devmem TCP, in one place.
//
// Matches Linux 6.18 (include/uapi/linux/netdev.h, uio.h, asm-generic/socket.h and the
// arch/*/include/uapi/asm/socket.h variants, ethtool_netlink_generated.h, include/linux/socket.h
// for MSG_SOCK_DEVMEM, include/linux/errno.h for ETOOSMALL). Written from those headers' values,
// not copied. System headers of the build machine are often older than the running kernel, so
// these are ours; where a system header does define a value we check it agrees (static_assert).
//
// NOTE: Google's pre-upstream TCPX ABI used different numbers (SO_DEVMEM_DONTNEED 97, ...).
// Never mix them with these.
#pragma once

#include <linux/errqueue.h>
#include <linux/ethtool_netlink.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>

namespace dmx::devmem::abi {

inline constexpr const char* kKernelVersion = "6.18";

// --- generic netlink family "netdev" (version 1) ---------------------------------------------
inline constexpr const char* kNetdevFamilyName = "netdev";
inline constexpr uint8_t kNetdevFamilyVersion = 1;
inline constexpr uint8_t kCmdBindRx = 13;  // NETDEV_CMD_BIND_RX, Linux >= 6.12
inline constexpr uint8_t kCmdBindTx = 15;  // NETDEV_CMD_BIND_TX, Linux >= 6.16
// attribute set "dmabuf"
inline constexpr uint16_t kDmabufIfindex = 1;  // u32
inline constexpr uint16_t kDmabufQueues = 2;   // nest (repeated), set "queue-id"
inline constexpr uint16_t kDmabufFd = 3;       // u32
inline constexpr uint16_t kDmabufId = 4;       // u32, in the reply
// attribute set "queue" (used nested as "queue-id")
inline constexpr uint16_t kQueueId = 1;       // u32
inline constexpr uint16_t kQueueType = 3;     // u32
inline constexpr uint32_t kQueueTypeRx = 0;   // NETDEV_QUEUE_TYPE_RX
inline constexpr uint32_t kQueueTypeTx = 1;   // NETDEV_QUEUE_TYPE_TX

// --- socket level -----------------------------------------------------------------------------
// SO_DEVMEM_* (and SCM_DEVMEM_* of the same value) differ by architecture.
#if defined(__alpha__) || defined(__mips__)
inline constexpr int kSoDevmemLinear = 78;
inline constexpr int kSoDevmemDmabuf = 79;
inline constexpr int kSoDevmemDontneed = 80;
#elif defined(__hppa__)
inline constexpr int kSoDevmemLinear = 0x404E;
inline constexpr int kSoDevmemDmabuf = 0x404F;
inline constexpr int kSoDevmemDontneed = 0x4050;
#elif defined(__sparc__)
inline constexpr int kSoDevmemLinear = 0x57;
inline constexpr int kSoDevmemDmabuf = 0x58;
inline constexpr int kSoDevmemDontneed = 0x59;
#else  // asm-generic: x86-64, arm64, riscv, ...
inline constexpr int kSoDevmemLinear = 78;
inline constexpr int kSoDevmemDmabuf = 79;
inline constexpr int kSoDevmemDontneed = 80;
#endif
inline constexpr int kScmDevmemLinear = kSoDevmemLinear;
inline constexpr int kScmDevmemDmabuf = kSoDevmemDmabuf;

// include/linux/socket.h (not uapi): recvmsg flag asking for devmem cmsgs.
inline constexpr int kMsgSockDevmem = 0x2000000;
inline constexpr int kMsgZerocopy = 0x4000000;
inline constexpr int kSoZerocopy = 60;
// include/linux/errno.h (kernel-internal, but returned to user space by put_cmsg_notrunc).
inline constexpr int kEtoosmall = 525;

// sock_devmem_dontneed() limits (net/core/sock.c).
inline constexpr size_t kMaxDontneedTokens = 128;
inline constexpr size_t kMaxDontneedFrags = 1024;
// Tokens come from an xarray limited to 31 bits (xa_limit_31b).
inline constexpr uint32_t kMaxToken = 0x7fffffff;
// A dmabuf fragment is at most one net_iov: PAGE_SIZE (4 KiB on the architectures we build for).
inline constexpr uint32_t kMaxFragSize = 4096;

// include/uapi/linux/uio.h
struct DmabufCmsg {
  uint64_t frag_offset;  // offset into the dmabuf where the frag starts
  uint32_t frag_size;
  uint32_t frag_token;   // token for SO_DEVMEM_DONTNEED
  uint32_t dmabuf_id;    // binding id the frag belongs to
  uint32_t flags;        // reserved
};
struct DmabufToken {
  uint32_t token_start;
  uint32_t token_count;
};
static_assert(sizeof(DmabufCmsg) == 24 && alignof(DmabufCmsg) == 8);
static_assert(offsetof(DmabufCmsg, frag_size) == 8 && offsetof(DmabufCmsg, frag_token) == 12);
static_assert(offsetof(DmabufCmsg, dmabuf_id) == 16 && offsetof(DmabufCmsg, flags) == 20);
static_assert(sizeof(DmabufToken) == 8);

// --- ethtool netlink (family "ethtool"): header split --------------------------------------
inline constexpr const char* kEthtoolFamilyName = "ethtool";
inline constexpr uint8_t kEthtoolMsgRingsGet = 15;
inline constexpr uint8_t kEthtoolMsgRingsSet = 16;
inline constexpr uint16_t kEthtoolHeaderDevIndex = 1;  // in nest ETHTOOL_A_*_HEADER
inline constexpr uint16_t kEthtoolHeaderDevName = 2;
inline constexpr uint16_t kRingsHeader = 1;
inline constexpr uint16_t kRingsTcpDataSplit = 11;  // u8: 0 unknown, 1 disabled, 2 enabled
inline constexpr uint16_t kRingsHdsThresh = 17;     // u32, Linux >= 6.13
inline constexpr uint16_t kRingsHdsThreshMax = 18;  // u32
inline constexpr uint8_t kTcpDataSplitUnknown = 0;
inline constexpr uint8_t kTcpDataSplitDisabled = 1;
inline constexpr uint8_t kTcpDataSplitEnabled = 2;

// Cross-checks against the build machine's headers where they have the value.
#ifdef SO_ZEROCOPY
static_assert(SO_ZEROCOPY == kSoZerocopy);
#endif
#ifdef MSG_ZEROCOPY
static_assert(MSG_ZEROCOPY == kMsgZerocopy);
#endif
#ifdef SO_DEVMEM_DONTNEED
static_assert(SO_DEVMEM_DONTNEED == kSoDevmemDontneed && SO_DEVMEM_DMABUF == kSoDevmemDmabuf);
#endif
static_assert(SO_EE_ORIGIN_ZEROCOPY == 5);
static_assert(ETHTOOL_MSG_RINGS_GET == kEthtoolMsgRingsGet && ETHTOOL_MSG_RINGS_SET == kEthtoolMsgRingsSet);
static_assert(ETHTOOL_A_RINGS_TCP_DATA_SPLIT == kRingsTcpDataSplit);
static_assert(ETHTOOL_A_HEADER_DEV_INDEX == kEthtoolHeaderDevIndex && ETHTOOL_A_HEADER_DEV_NAME == kEthtoolHeaderDevName);
static_assert(ETHTOOL_TCP_DATA_SPLIT_ENABLED == kTcpDataSplitEnabled);

}  // namespace dmx::devmem::abi
