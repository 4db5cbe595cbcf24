// io_uring numbers the probe needs that older system headers lack. Matches Linux 6.18
// include/uapi/linux/io_uring.h (enum io_uring_op); the rest comes from <linux/io_uring.h>.
#pragma once

#include <linux/io_uring.h>

#include <cstdint>

namespace dmx::probe::uapi {

// IORING_OP_RECV_ZC (zero-copy receive into a registered interface queue), Linux 6.15+.
// Counted from IORING_OP_SENDMSG_ZC = 48: READ_MULTISHOT 49, WAITID 50, FUTEX_WAIT 51,
// FUTEX_WAKE 52, FUTEX_WAITV 53, FIXED_FD_INSTALL 54, FTRUNCATE 55, BIND 56, LISTEN 57, RECV_ZC 58.
inline constexpr unsigned kIoringOpRecvZc = 58;
inline constexpr unsigned kIoringOpSendmsgZc = 48;
static_assert(IORING_OP_SENDMSG_ZC == kIoringOpSendmsgZc, "io_uring opcode numbering differs from Linux 6.18");

}  // namespace dmx::probe::uapi

namespace dmx::probe::uapi {

// IORING_REGISTER_ZCRX_IFQ and its argument structs, Linux 6.18 include/uapi/linux/io_uring.h
// (moved to io_uring/zcrx.h later). Reserved fields must be zero; sizes are part of the ABI.
inline constexpr unsigned kIoringRegisterZcrxIfq = 32;

struct ZcrxOffsets {  // struct io_uring_zcrx_offsets
  uint32_t head, tail, rqes, resv2;
  uint64_t resv[2];
};
struct ZcrxAreaReg {  // struct io_uring_zcrx_area_reg
  uint64_t addr, len, rq_area_token;
  uint32_t flags, dmabuf_fd;
  uint64_t resv2[2];
};
struct RegionDesc {  // struct io_uring_region_desc
  uint64_t user_addr, size;
  uint32_t flags, id;
  uint64_t mmap_offset;
  uint64_t resv[4];
};
struct ZcrxIfqReg {  // struct io_uring_zcrx_ifq_reg
  uint32_t if_idx, if_rxq, rq_entries, flags;
  uint64_t area_ptr, region_ptr;
  ZcrxOffsets offsets;
  uint32_t zcrx_id, resv2;
  uint64_t resv[3];
};
static_assert(sizeof(ZcrxOffsets) == 32);
static_assert(sizeof(ZcrxAreaReg) == 48);
static_assert(sizeof(RegionDesc) == 64);
static_assert(sizeof(ZcrxIfqReg) == 96);

}  // namespace dmx::probe::uapi
