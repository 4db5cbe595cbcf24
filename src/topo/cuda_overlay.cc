// The NVLink/P2P overlay from the CUDA runtime (built only with DMX_HAVE_CUDA). The runtime is
// linked statically, so on a machine without a driver every call fails cleanly and the overlay
// says why; nothing here may crash or abort.
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <cctype>

#include "topo/topology.h"

namespace dmx::topo {

namespace {

std::string why(const char* call, cudaError_t err) {
  return fmt::format("{} failed: {} ({})", call, cudaGetErrorString(err), static_cast<int>(err));
}

}  // namespace

CudaOverlay query_cuda_overlay() {
  CudaOverlay o;
  int driver = 0;
  cudaError_t err = cudaDriverGetVersion(&driver);
  if (err != cudaSuccess) {
    o.reason = why("cudaDriverGetVersion", err);
    return o;
  }
  if (driver == 0) {
    o.reason = "no CUDA driver is installed (cudaDriverGetVersion reports 0)";
    return o;
  }
  o.driver_version = driver;
  cudaRuntimeGetVersion(&o.runtime_version);
  int count = 0;
  err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    o.reason = why("cudaGetDeviceCount", err);
    return o;
  }
  if (count == 0) {
    o.reason = "the CUDA driver reports no devices";
    return o;
  }
  for (int i = 0; i < count; ++i) {
    CudaDevice d;
    d.ordinal = i;
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) == cudaSuccess) {
      d.name = prop.name;
      d.total_memory = prop.totalGlobalMem;
      d.cc_major = prop.major;
      d.cc_minor = prop.minor;
    }
    char bus[32] = {};
    if (cudaDeviceGetPCIBusId(bus, sizeof(bus), i) == cudaSuccess) {
      // The runtime spells "00000000:06:00.0" in upper case; sysfs "0000:06:00.0".
      std::string s(bus);
      for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      size_t colon = s.find(':');
      if (colon != std::string::npos && colon > 4) s = s.substr(colon - 4);
      d.bus_id = s;
    }
    o.devices.push_back(std::move(d));
  }
  for (int a = 0; a < count; ++a)
    for (int b = 0; b < count; ++b) {
      if (a == b) continue;
      CudaPeerLink l;
      l.a = a;
      l.b = b;
      int v = 0;
      if (cudaDeviceGetP2PAttribute(&v, cudaDevP2PAttrAccessSupported, a, b) == cudaSuccess) l.access = v != 0;
      if (cudaDeviceGetP2PAttribute(&v, cudaDevP2PAttrNativeAtomicSupported, a, b) == cudaSuccess)
        l.native_atomics = v != 0;
      if (cudaDeviceGetP2PAttribute(&v, cudaDevP2PAttrPerformanceRank, a, b) == cudaSuccess) l.perf_rank = v;
      o.links.push_back(l);
    }
  o.available = true;
  return o;
}

}  // namespace dmx::topo
