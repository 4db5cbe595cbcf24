# RDMA (verbs) is optional. DMX_ENABLE_RDMA defaults to ON when libibverbs and its headers are
# found (Debian: libibverbs-dev); forcing it ON without them is a configure error. Without it the
# rdma transport is built as a stub that says why (src/transport/rdma/rdma_stub.cc). Sets
# DMX_HAVE_RDMA and DMX_RDMA_REASON (for the summary and `dmx --version`).
include(DmxOptional)
dmx_find_optional(DMX_IBVERBS infiniband/verbs.h ibverbs DMX_ENABLE_RDMA "Build the rdma (verbs) transport"
                  libibverbs-dev)
set(DMX_HAVE_RDMA 0)
if(DMX_ENABLE_RDMA)
  include(CheckSymbolExists)
  set(CMAKE_REQUIRED_INCLUDES ${DMX_IBVERBS_INCLUDE_DIR})
  set(CMAKE_REQUIRED_LIBRARIES ${DMX_IBVERBS_LIBRARY})
  check_symbol_exists(ibv_reg_dmabuf_mr infiniband/verbs.h DMX_IBVERBS_HAS_DMABUF)
  unset(CMAKE_REQUIRED_INCLUDES)
  unset(CMAKE_REQUIRED_LIBRARIES)
  if(NOT DMX_IBVERBS_HAS_DMABUF)
    message(FATAL_ERROR "DMX_ENABLE_RDMA=ON but ${DMX_IBVERBS_LIBRARY} lacks ibv_reg_dmabuf_mr (rdma-core 34 or "
                        "later is needed); turn DMX_ENABLE_RDMA off")
  endif()
  set(DMX_HAVE_RDMA 1)
  set(DMX_RDMA_REASON "rdma with ${DMX_IBVERBS_LIBRARY}")
elseif(DMX_IBVERBS_LIBRARY)
  set(DMX_RDMA_REASON "without rdma: DMX_ENABLE_RDMA=OFF (${DMX_IBVERBS_LIBRARY} not used)")
else()
  set(DMX_RDMA_REASON "without rdma: libibverbs not found (install libibverbs-dev)")
endif()
