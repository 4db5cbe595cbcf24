// python/src/dlpack.h — the DLPack ABI (https://dmlc.github.io/dlpack/latest/c_api.html),
// declared here from the public specification (v1.x; the unversioned struct of v0.x too) rather
// than vendored. Only what a consumer needs.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dmxpy::dlpack {

enum DeviceType : int32_t { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13 };

// DLDataType::code. Every code but kDLOpaqueHandle (pointers) is plain data; 7-17 are the float8,
// float6 and float4 formats of DLPack 1.1.
enum DataTypeCode : uint8_t {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLOpaqueHandle = 3,
  kDLBfloat = 4,
  kDLComplex = 5,
  kDLBool = 6,
  kDLFloat8First = 7,
  kDLFloat4E2m1fn = 17,
};

struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null: compact row-major
  uint64_t byte_offset;
};
// Capsule "dltensor"; renamed "used_dltensor" by the consumer, which then owns it.
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};
struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};
inline constexpr uint64_t kFlagReadOnly = 1ULL << 0;
// Capsule "dltensor_versioned"; renamed "used_dltensor_versioned".
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  uint64_t flags;
  DLTensor dl_tensor;
};

static_assert(sizeof(DLDevice) == 8 && sizeof(DLDataType) == 4);
static_assert(sizeof(DLTensor) == 48 && offsetof(DLTensor, ndim) == 16 && offsetof(DLTensor, shape) == 24 &&
              offsetof(DLTensor, byte_offset) == 40);
static_assert(sizeof(DLManagedTensor) == 64 && offsetof(DLManagedTensor, deleter) == 56);
static_assert(sizeof(DLManagedTensorVersioned) == 80 && offsetof(DLManagedTensorVersioned, flags) == 24 &&
              offsetof(DLManagedTensorVersioned, dl_tensor) == 32);

}  // namespace dmxpy::dlpack
