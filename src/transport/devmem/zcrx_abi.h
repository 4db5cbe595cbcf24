// The io_uring zero-copy receive (zcrx) ABI, in one place: the devmem receiver (zcrx.h) and the
// general probe (src/probe/checks.cc, io_uring.zcrx[IF]) both use these.
//
// Matches Linux 6.18 include/uapi/linux/io_uring.h (zcrx since 6.15, dma-buf areas since 6.16).
// Written from those headers' values, not copied: Debian's headers and liburing predate zcrx, so
// these are ours; static_asserts pin every layout, and where the system header has a value we
// check it agrees.
#pragma once

#include <linux/io_uring.h>

#include <cstddef>
#include <cstdint>

namespace dmx::devmem::zcrx_abi {

inline constexpr uint32_t kRegisterZcrxIfq = 32;       // IORING_REGISTER_ZCRX_IFQ
inline constexpr uint8_t kOpRecvZc = 58;               // IORING_OP_RECV_ZC
inline constexpr uint8_t kOpSendmsgZc = 48;            // to check the enum against the system's
// RECV_ZC = SENDMSG_ZC + 10: READ_MULTISHOT, WAITID, FUTEX_WAIT/WAKE/WAITV, FIXED_FD_INSTALL,
// FTRUNCATE, BIND, LISTEN come between (6.18 enum io_uring_op).
inline constexpr uint16_t kRecvMultishot = 1u << 1;    // IORING_RECV_MULTISHOT (sqe->ioprio)
inline constexpr uint32_t kSetupRDisabled = 1u << 6;   // IORING_SETUP_R_DISABLED
inline constexpr uint32_t kSetupCqe32 = 1u << 11;      // IORING_SETUP_CQE32
inline constexpr uint32_t kSetupSingleIssuer = 1u << 12;
inline constexpr uint32_t kSetupDeferTaskrun = 1u << 13;
inline constexpr uint32_t kCqeFMore = 1u << 1;         // IORING_CQE_F_MORE
inline constexpr uint32_t kRegisterEventfd = 4;       // IORING_REGISTER_EVENTFD
inline constexpr uint32_t kRegisterEnableRings = 12;  // IORING_REGISTER_ENABLE_RINGS
inline constexpr uint32_t kEnterGetevents = 1u << 0;
inline constexpr uint32_t kEnterExtArg = 1u << 3;
inline constexpr uint32_t kFeatSingleMmap = 1u << 0;
inline constexpr uint64_t kOffSqRing = 0, kOffCqRing = 0x8000000ull, kOffSqes = 0x10000000ull;
inline constexpr uint32_t kAreaDmabuf = 1;             // IORING_ZCRX_AREA_DMABUF
inline constexpr uint32_t kMemRegionTypeUser = 1;      // IORING_MEM_REGION_TYPE_USER
inline constexpr unsigned kAreaShift = 48;             // IORING_ZCRX_AREA_SHIFT
inline constexpr uint64_t kAreaMask = ~((uint64_t{1} << kAreaShift) - 1);
inline constexpr size_t kCqeSize = 32;                 // CQE32: 16-byte CQE + io_uring_zcrx_cqe

struct Rqe {          // struct io_uring_zcrx_rqe: a buffer given back through the refill ring
  uint64_t off;       // area token | offset in the area
  uint32_t len;
  uint32_t pad;
};
struct ZcrxCqe {      // struct io_uring_zcrx_cqe: the second half of a RECV_ZC CQE32
  uint64_t off;       // area token | offset in the area
  uint64_t pad;
};
struct Offsets {      // struct io_uring_zcrx_offsets (into the refill region)
  uint32_t head, tail, rqes, resv2;
  uint64_t resv[2];
};
struct AreaReg {      // struct io_uring_zcrx_area_reg
  uint64_t addr;      // 0 for a dma-buf area
  uint64_t len;       // the dma-buf's whole length
  uint64_t rq_area_token;  // out: the area's bits for refill offsets
  uint32_t flags;     // kAreaDmabuf
  uint32_t dmabuf_fd;
  uint64_t resv2[2];
};
struct RegionDesc {   // struct io_uring_region_desc
  uint64_t user_addr;
  uint64_t size;
  uint32_t flags;     // kMemRegionTypeUser: memory we provide
  uint32_t id;
  uint64_t mmap_offset;
  uint64_t resv[4];
};
struct IfqReg {       // struct io_uring_zcrx_ifq_reg
  uint32_t if_idx;
  uint32_t if_rxq;
  uint32_t rq_entries;
  uint32_t flags;
  uint64_t area_ptr;    // AreaReg*
  uint64_t region_ptr;  // RegionDesc*
  Offsets offsets;      // out
  uint32_t zcrx_id;     // out: for sqe->zcrx_ifq_idx
  uint32_t resv2;       // rx_buf_len after 6.18
  uint64_t resv[3];
};
// The SQE fields RECV_ZC uses (struct io_uring_sqe is 64 bytes).
inline constexpr size_t kSqeSize = 64;
inline constexpr size_t kSqeZcrxIfqIdx = 44;  // union with splice_fd_in / file_index

// The uapi layouts (include/uapi/linux/io_uring.h, 6.18; field order as in
// /work/shared/reference/devmem_tcp.md 1.10): every field's offset, and the sizes.
static_assert(sizeof(Rqe) == 16 && offsetof(Rqe, off) == 0 && offsetof(Rqe, len) == 8);
static_assert(sizeof(ZcrxCqe) == 16 && offsetof(ZcrxCqe, off) == 0);
static_assert(sizeof(Offsets) == 32 && offsetof(Offsets, head) == 0 && offsetof(Offsets, tail) == 4 &&
              offsetof(Offsets, rqes) == 8 && offsetof(Offsets, resv) == 16);
static_assert(sizeof(AreaReg) == 48 && offsetof(AreaReg, addr) == 0 && offsetof(AreaReg, len) == 8 &&
              offsetof(AreaReg, rq_area_token) == 16 && offsetof(AreaReg, flags) == 24 &&
              offsetof(AreaReg, dmabuf_fd) == 28 && offsetof(AreaReg, resv2) == 32);
static_assert(sizeof(RegionDesc) == 64 && offsetof(RegionDesc, user_addr) == 0 && offsetof(RegionDesc, size) == 8 &&
              offsetof(RegionDesc, flags) == 16 && offsetof(RegionDesc, id) == 20 &&
              offsetof(RegionDesc, mmap_offset) == 24 && offsetof(RegionDesc, resv) == 32);
static_assert(sizeof(IfqReg) == 96 && offsetof(IfqReg, if_idx) == 0 && offsetof(IfqReg, if_rxq) == 4 &&
              offsetof(IfqReg, rq_entries) == 8 && offsetof(IfqReg, flags) == 12 && offsetof(IfqReg, area_ptr) == 16 &&
              offsetof(IfqReg, region_ptr) == 24 && offsetof(IfqReg, offsets) == 32 && offsetof(IfqReg, zcrx_id) == 64 &&
              offsetof(IfqReg, resv2) == 68 && offsetof(IfqReg, resv) == 72);
static_assert(kAreaMask == 0xffff000000000000ull);

// Cross-checks against the build machine's header where it has the value.
static_assert(sizeof(io_uring_sqe) == kSqeSize && offsetof(io_uring_sqe, file_index) == kSqeZcrxIfqIdx);
static_assert(sizeof(io_uring_cqe) == 16);
static_assert(IORING_OP_SENDMSG_ZC == kOpSendmsgZc && kOpRecvZc == kOpSendmsgZc + 10);
static_assert(IORING_SETUP_CQE32 == kSetupCqe32 && IORING_SETUP_SINGLE_ISSUER == kSetupSingleIssuer &&
              IORING_SETUP_DEFER_TASKRUN == kSetupDeferTaskrun);
static_assert(IORING_CQE_F_MORE == kCqeFMore && IORING_ENTER_EXT_ARG == kEnterExtArg);
static_assert(IORING_RECV_MULTISHOT == kRecvMultishot);
static_assert(IORING_OFF_CQ_RING == kOffCqRing && IORING_OFF_SQES == kOffSqes);
static_assert(IORING_SETUP_R_DISABLED == kSetupRDisabled && IORING_REGISTER_EVENTFD == kRegisterEventfd &&
              IORING_REGISTER_ENABLE_RINGS == kRegisterEnableRings);
#ifdef IORING_REGISTER_ZCRX_IFQ
static_assert(IORING_REGISTER_ZCRX_IFQ == kRegisterZcrxIfq);
#endif

}  // namespace dmx::devmem::zcrx_abi
