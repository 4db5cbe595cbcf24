// io_uring numbers the probe needs that older system headers lack. Matches Linux 6.18
// include/uapi/linux/io_uring.h (enum io_uring_op); the rest comes from <linux/io_uring.h>.
#pragma once

#include <linux/io_uring.h>

namespace dmx::probe::uapi {

// IORING_OP_RECV_ZC (zero-copy receive into a registered interface queue), Linux 6.15+.
// Counted from IORING_OP_SENDMSG_ZC = 48: READ_MULTISHOT 49, WAITID 50, FUTEX_WAIT 51,
// FUTEX_WAKE 52, FUTEX_WAITV 53, FIXED_FD_INSTALL 54, FTRUNCATE 55, BIND 56, LISTEN 57, RECV_ZC 58.
inline constexpr unsigned kIoringOpRecvZc = 58;
inline constexpr unsigned kIoringOpSendmsgZc = 48;
static_assert(IORING_OP_SENDMSG_ZC == kIoringOpSendmsgZc, "io_uring opcode numbering differs from Linux 6.18");

}  // namespace dmx::probe::uapi
