// The parts of the CUDA backend that need no GPU: the error helper, the launch geometry, the
// launcher's dispatch table, OpenDefaultDevices without a GPU. Run by CI (label `cuda`).
#include <catch2/catch.hpp>

#include <string>

#include "cuda/cast_kernels.h"
#include "cuda/cuda_device.h"
#include "cuda/cuda_error.h"
#include "cuda/launch_geometry.h"
#include "cuda/probe.h"
#include "loadstone/device_map.h"
#include "loadstone/platform.h"
#include "runtime/device/platform_impl.h"
#include "runtime/convert/cast.h"
#include "runtime/convert/fp8_block.h"

namespace loadstone::cuda {
namespace {

bool Contains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

// cudaError_t values (stable across CUDA releases; the header is not included here).
constexpr int kInvalidValue = 1, kMemoryAllocation = 2, kInsufficientDriver = 35,
              kNoDevice = 100, kInvalidDevice = 101, kNoKernelImage = 209,
              kIllegalAddress = 700, kLaunchFailure = 719;

TEST_CASE("cuda errors: success is OK") {
  CHECK(CudaErrorStatus(0, {"cudaMalloc", 0, 100}).ok());
}

TEST_CASE("cuda errors: out of memory names the device, the size and a fix") {
  const Status s = CudaErrorStatus(kMemoryAllocation, {"cudaMalloc", 3, 3ull << 30});
  CHECK(s.code() == StatusCode::kOutOfMemory);
  CHECK(Contains(s.message(), "cuda:3"));
  CHECK(Contains(s.message(), "cudaMalloc"));
  CHECK(Contains(s.message(), "3.00 GiB (3221225472 bytes)"));
  CHECK(Contains(s.message(), "cudaErrorMemoryAllocation"));
  CHECK(Contains(s.message(), "fix:"));
}

TEST_CASE("cuda errors: codes map to the right status code") {
  CHECK(CudaErrorStatus(kInvalidValue, {"cudaMemcpyAsync", 0}).code() ==
        StatusCode::kInvalidArgument);
  CHECK(CudaErrorStatus(kNoDevice, {"cudaGetDeviceCount"}).code() == StatusCode::kNotFound);
  CHECK(CudaErrorStatus(kInvalidDevice, {"cudaSetDevice", 9}).code() == StatusCode::kNotFound);
  const Status driver = CudaErrorStatus(kInsufficientDriver, {"cudaGetDeviceCount"});
  CHECK(driver.code() == StatusCode::kUnsupported);
  CHECK(Contains(driver.message(), "driver"));
  const Status image = CudaErrorStatus(kNoKernelImage, {"cast kernel", 0});
  CHECK(image.code() == StatusCode::kUnsupported);
  CHECK(Contains(image.message(), "CMAKE_CUDA_ARCHITECTURES"));
  CHECK(CudaErrorStatus(kIllegalAddress, {"cast kernel", 1}).code() == StatusCode::kIOError);
  CHECK(CudaErrorStatus(kLaunchFailure, {"cast kernel", 1}).code() == StatusCode::kIOError);
  // No device: "cuda", no size when none is given.
  const Status plain = CudaErrorStatus(kNoDevice, "cudaErrorNoDevice", "no CUDA-capable device",
                                       {"cudaGetDeviceCount"});
  CHECK(std::string(plain.message()).rfind("cuda: cudaGetDeviceCount failed", 0) == 0);
}

TEST_CASE("launch geometry: vector path when aligned, tail, grid cap") {
  // bf16 -> f16: 8 elements per 16-byte load, 16-byte stores.
  auto g = PlanCast(1000, 2, 2, 0x1000, 0x2000, 132);
  CHECK(g.vectorized);
  CHECK(g.vector_elems == 8);
  CHECK(g.vectors == 125);
  CHECK(g.tail == 0);
  CHECK(g.blocks == 1);
  // f32 -> bf16: 4 elements, 8-byte stores: dst needs 8-byte alignment only.
  g = PlanCast(10, 4, 2, 0x1000, 0x2008, 132);
  CHECK(g.vectorized);
  CHECK(g.vectors == 2);
  CHECK(g.tail == 2);
  // A misaligned source or destination takes the scalar path.
  CHECK_FALSE(PlanCast(1000, 2, 2, 0x1002, 0x2000, 132).vectorized);
  CHECK_FALSE(PlanCast(1000, 2, 2, 0x1000, 0x2004, 132).vectorized);
  g = PlanCast(1000, 2, 2, 0x1000, 0x2001, 132);
  CHECK_FALSE(g.vectorized);
  CHECK(g.tail == 1000);
  CHECK(g.blocks == 4);
  // fp8 -> f32: 16 elements per load, 64 bytes out as 16-byte stores.
  g = PlanCast(15, 1, 4, 0, 0, 132);
  CHECK_FALSE(g.vectorized);  // fewer elements than one vector
  CHECK(g.tail == 15);
  // Large: capped at kCastBlocksPerSm per multiprocessor; grid-stride covers the rest.
  g = PlanCast(uint64_t{1} << 34, 2, 2, 0, 0, 132);
  CHECK(g.blocks == 132u * kCastBlocksPerSm);
  CHECK(g.vectors == (uint64_t{1} << 31));
  g = PlanCast(uint64_t{1} << 34, 2, 2, 0, 0, 0);  // sm_count 0 is treated as 1
  CHECK(g.blocks == kCastBlocksPerSm);
  CHECK(PlanCast(0, 2, 2, 0, 0, 132).blocks == 0);
}

TEST_CASE("cast launcher: the same pairs as the CPU reference, errors for the rest") {
  for (int f = 0; f < kNumDTypes; ++f) {
    for (int t = 0; t < kNumDTypes; ++t) {
      const auto from = static_cast<DType>(f), to = static_cast<DType>(t);
      INFO(TorchName(from) << " -> " << TorchName(to));
      CHECK(CanCastOnDevice(from, to) == (from != to && convert::CanCast(from, to)));
    }
  }
  const Status s = LaunchCast(DType::kI32, DType::kF32, nullptr, nullptr, 4, nullptr, 1, 0);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(Contains(s.message(), "int32"));
}

TEST_CASE("fp8 block dequant launcher: the CPU reference's pairs, bad layouts refused") {
  for (int f = 0; f < kNumDTypes; ++f) {
    for (int t = 0; t < kNumDTypes; ++t) {
      const auto from = static_cast<DType>(f), to = static_cast<DType>(t);
      INFO(TorchName(from) << " -> " << TorchName(to));
      CHECK(CanDequantFp8BlockOnDevice(from, to) == convert::CanDequantFp8Block(from, to));
    }
  }
  const convert::Fp8BlockScales bad{nullptr, 300, 128, 128, 2};  // 300 columns need 3 scales
  const Status s = LaunchDequantFp8Block(DType::kF8E4M3, DType::kBF16, nullptr, nullptr, 0, 4, bad,
                                         nullptr, 1, 0);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(Contains(s.message(), "layout"));
  CHECK(LaunchDequantFp8Block(DType::kF16, DType::kBF16, nullptr, nullptr, 0, 4, bad, nullptr, 1, 0)
            .code() == StatusCode::kInvalidArgument);
}

TEST_CASE("default platform: one device per GPU, or none with the reason, and free memory") {
  const std::shared_ptr<const Platform> platform = Platform::Default();
  const Platform::Impl& parts = PlatformAccess::Get(*platform);
  std::string log;
  const device::DeviceSet devices = parts.open_devices(&log);
  const CudaProbeResult probe = ProbeCuda();
  CHECK_FALSE(log.empty());
  CHECK_FALSE(platform->simulated());
  if (probe.device_count == 0) {
    CHECK(devices.empty());
    CHECK(platform->Gpus().empty());
    CHECK(Contains(log, "CPU only: no CUDA device: "));
    CHECK(Contains(platform->description(), "CPU only: no CUDA device: "));
    CHECK_FALSE(Contains(log, "insufficient"));  // no driver is not an old driver
    CHECK(CudaFreeBytesPerDevice().empty());
    auto opened = CudaDevice::Open(0);
    REQUIRE_FALSE(opened.ok());
    CHECK(Contains(opened.status().message(), "cuda:0"));
    WARN("no GPU here: " << log);
    return;
  }
  CHECK(devices.size() == static_cast<size_t>(probe.device_count));
  CHECK(devices[0]->Info().name == "cuda:0");
  const auto gpus = platform->Gpus();
  REQUIRE(gpus.size() == devices.size());
  CHECK(gpus[0].name == "cuda:0");
  CHECK(gpus[0].free_bytes > 0);
  CHECK(gpus[0].free_bytes <= gpus[0].memory_bytes);
}

}  // namespace
}  // namespace loadstone::cuda
