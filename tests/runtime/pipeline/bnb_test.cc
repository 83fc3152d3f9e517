// bitsandbytes checkpoints (tests/fixtures/make_bnb_fixtures.py: bitsandbytes 0.48.2's
// quantize_4bit saved as transformers saves a Linear4bit, and Linear8bitLt's own state dicts)
// loaded and dequantized on the CPU, against the values bitsandbytes decodes them to
// (expected*.safetensors), bit for bit; kept packed, byte for byte; sharded with the companions
// in the other shard; hostile states.
#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/reader.h"
#include "io/reader_wrapper.h"
#include "loadstone/checkpoint.h"
#include "loadstone/loader.h"
#include "loadstone/plan.h"
#include "loadstone/writer.h"
#include "runtime/pipeline/test_model.h"
#include "runtime/pipeline/test_platform.h"
#include "loadstone/platform.h"
#include "testing/file_bytes.h"
#include "testing/quantized_fixtures.h"
#include "testing/rewritten_checkpoint.h"
#include "testing/temp_dir.h"

namespace loadstone {
namespace {

namespace fs = std::filesystem;
using testing::FileBytes;
using testing::HostBytes;
using testing::Named;
using testing::TempDir;
const fs::path kFixtures = fs::path(LOADSTONE_SOURCE_DIR) / "tests/fixtures/bnb";

const std::vector<std::string> kCases = {"nf4",  "fp4",    "fp4_neg_zero", "nested", "fp4_nested",
                                         "bs32", "bs4096", "storage_bf16", "odd"};

// The loaded tensor `name` has the bytes of expected.safetensors' `name.<dtype>`.
void CheckDecoded(LoadHandle& load, const Checkpoint& expected, const std::string& name,
                  DType dtype) {
  INFO(name << " as " << testing::DTypeSuffix(dtype));
  const TensorInfo* want = expected.Find(name + "." + testing::DTypeSuffix(dtype));
  REQUIRE(want != nullptr);
  const Tensor& got = load.Tensor(name).get();
  CHECK(got.dtype() == dtype);
  CHECK(got.shape() == want->shape);
  REQUIRE(got.nbytes() == want->nbytes);
  const std::vector<std::byte> bytes = FileBytes(expected, *want);
  CHECK(std::memcmp(got.data(), bytes.data(), bytes.size()) == 0);
}

TEST_CASE("bnb4: the catalog reads each weight's quant state", "[bnb]") {
  const Checkpoint ckpt = testing::OpenFixture(kFixtures / "bnb4.safetensors");
  const TensorInfo* nested = ckpt.Find("nested.weight");
  REQUIRE(nested != nullptr);
  REQUIRE(nested->packed);
  CHECK(nested->packed->scheme == "bnb-nf4");
  CHECK(nested->packed->element_shape == std::vector<uint64_t>{66, 515});
  CHECK(nested->element_count() == 66 * 515);
  CHECK(nested->packed->block_elems == 64);
  const Bnb4State& s = *nested->packed->bnb4;
  CHECK(s.nested);
  CHECK(s.nested_blocksize == 256);
  CHECK(s.nested_absmax.size() == 3);  // 532 blocks in nested blocks of 256
  CHECK(s.dtype == DType::kBF16);
  CHECK(s.absmax == "nested.weight.absmax");
  CHECK(s.companions.size() == 5);
  const TensorInfo* storage = ckpt.Find("storage_bf16.weight");
  REQUIRE(storage->packed);
  CHECK(storage->dtype == DType::kBF16);  // quant_storage: the bytes as bf16
  CHECK(ckpt.Find("fp4.weight")->packed->scheme == "bnb-fp4");
  CHECK(ckpt.Find("odd.weight")->packed->element_shape == std::vector<uint64_t>{5, 7});
  CHECK_FALSE(ckpt.Find("nf4.weight.absmax")->packed);
}

TEST_CASE("bnb4: every case dequantizes as bitsandbytes decodes it, bit for bit", "[bnb]") {
  const DType dtype = GENERATE(DType::kF32, DType::kBF16, DType::kF16);
  // Reads of a few KiB cut the larger weights into pieces that start inside a block.
  const uint64_t max_chunk = GENERATE(uint64_t{16} << 20, uint64_t{4096});
  INFO(testing::DTypeSuffix(dtype) << ", max_chunk " << max_chunk);
  const Checkpoint ckpt = testing::OpenFixture(kFixtures / "bnb4.safetensors");
  const Checkpoint expected = testing::OpenFixture(kFixtures / "expected.safetensors");
  PlanOptions opt;
  opt.dtype = dtype;
  opt.max_chunk = max_chunk;
  auto plan = Plan(ckpt, opt);
  INFO(plan.status().ToString());
  REQUIRE(plan.ok());
  size_t dequantized = 0;
  for (const TensorPlan& tp : plan->tensors) {
    dequantized += tp.conversion == Conversion::kDequantBnb4;
    // Every quant-state tensor as stored, whatever the target dtype.
    const std::string& name = ckpt.tensors()[tp.source].name;
    if (name.find(".weight.") != std::string::npos) CHECK(tp.conversion == Conversion::kNone);
  }
  CHECK(dequantized == kCases.size());
  CHECK_THAT(plan->ToString(), Catch::Contains("9 dequants with a quant state"));
  Loader loader;
  LoadHandle load = loader.Load(ckpt, *plan);
  for (const std::string& c : kCases) CheckDecoded(load, expected, c + ".weight", dtype);
  for (const char* table :
       {"nf4.weight.quant_map", "nested.weight.nested_absmax", "nested.weight.absmax"}) {
    INFO(table);
    const Tensor& got = load.Tensor(table).get();
    const std::vector<std::byte> bytes = FileBytes(ckpt, *ckpt.Find(table));
    REQUIRE(got.nbytes() == bytes.size());
    CHECK(std::memcmp(got.data(), bytes.data(), bytes.size()) == 0);
  }
  const Status done = load.Done().get();
  INFO(done.ToString());
  CHECK(done.ok());
}

TEST_CASE("bnb4: FP4 code 8 is -0.0 (the fixture holds it)", "[bnb]") {
  const Checkpoint ckpt = testing::OpenFixture(kFixtures / "bnb4.safetensors");
  PlanOptions opt;
  opt.dtype = DType::kF32;
  auto plan = Plan(ckpt, opt);
  REQUIRE(plan.ok());
  Loader loader;
  LoadHandle load = loader.Load(ckpt, *plan);
  const Tensor& w = load.Tensor("fp4_neg_zero.weight").get();
  const std::vector<std::byte> packed = FileBytes(ckpt, *ckpt.Find("fp4_neg_zero.weight"));
  size_t code8 = 0;
  for (size_t e = 0; e < w.nbytes() / 4; ++e) {
    const auto byte = static_cast<uint8_t>(packed[e / 2]);
    if (((e % 2) ? byte & 0x0F : byte >> 4) != 8) continue;
    ++code8;
    uint32_t bits;
    std::memcpy(&bits, w.data() + 4 * e, 4);
    CHECK(bits == 0x80000000u);
  }
  CHECK(code8 >= 20);
  REQUIRE(load.Done().get().ok());
}

TEST_CASE("bnb4: keep_in_fp32 applies to the dequantized weight", "[bnb]") {
  const Checkpoint ckpt = testing::OpenFixture(kFixtures / "bnb4.safetensors");
  const Checkpoint expected = testing::OpenFixture(kFixtures / "expected.safetensors");
  PlanOptions opt;
  opt.dtype = DType::kBF16;
  opt.keep_in_fp32 = {"nested"};
  auto plan = Plan(ckpt, opt);
  REQUIRE(plan.ok());
  Loader loader;
  LoadHandle load = loader.Load(ckpt, *plan);
  CheckDecoded(load, expected, "nested.weight", DType::kF32);
  CheckDecoded(load, expected, "nf4.weight", DType::kBF16);
  REQUIRE(load.Done().get().ok());
}

TEST_CASE("bnb4: keep_packed places every packed tensor and companion as stored", "[bnb]") {
  const Checkpoint ckpt = testing::OpenFixture(kFixtures / "bnb4.safetensors");
  PlanOptions opt;
  opt.dtype = DType::kBF16;
  opt.keep_packed = true;
  auto plan = Plan(ckpt, opt);
  REQUIRE(plan.ok());
  Loader loader;
  LoadHandle load = loader.Load(ckpt, *plan);
  for (const TensorInfo& t : ckpt.tensors()) {
    INFO(t.name);
    const Tensor& got = load.Tensor(t.name).get();
    CHECK(got.dtype() == t.dtype);
    CHECK(got.shape() == t.shape);
    const std::vector<std::byte> bytes = FileBytes(ckpt, t);
    REQUIRE(got.nbytes() == bytes.size());
    CHECK(std::memcmp(got.data(), bytes.data(), bytes.size()) == 0);
  }
  REQUIRE(load.Done().get().ok());
}

TEST_CASE("bnb int8: LLM.int8 weights dequantize as int8_vectorwise_dequant, bit for bit",
          "[bnb]") {
  const DType dtype = GENERATE(DType::kF32, DType::kBF16, DType::kF16);
  INFO(testing::DTypeSuffix(dtype));
  const Checkpoint ckpt = testing::OpenFixture(kFixtures / "bnb8.safetensors");
  const TensorInfo* w = ckpt.Find("int8b.weight");
  REQUIRE((w->packed && w->packed->bnb8));
  CHECK(w->packed->scheme == "bnb-int8");
  CHECK(w->packed->bnb8->scb == "int8b.SCB");
  CHECK(w->packed->companions() == std::vector<std::string>{"int8b.SCB", "int8b.weight_format"});
  const Checkpoint expected = testing::OpenFixture(kFixtures / "expected8.safetensors");
  PlanOptions opt;
  opt.dtype = dtype;
  auto plan = Plan(ckpt, opt);
  INFO(plan.status().ToString());
  REQUIRE(plan.ok());
  CHECK_THAT(plan->ToString(), Catch::Contains("2 dequants with a quant state"));
  Loader loader;
  LoadHandle load = loader.Load(ckpt, *plan);
  CheckDecoded(load, expected, "int8a.weight", dtype);
  CheckDecoded(load, expected, "int8b.weight", dtype);
  // The SCB and the format as stored; the bias is an ordinary tensor, cast.
  CHECK(load.Tensor("int8b.SCB").get().dtype() == DType::kF32);
  CHECK(load.Tensor("int8b.weight_format").get().dtype() == DType::kU8);
  CHECK(load.Tensor("int8b.bias").get().dtype() == dtype);
  REQUIRE(load.Done().get().ok());
}

TEST_CASE("bnb int8: a weight in a GPU tile format stays packed or is refused, never misread",
          "[bnb]") {
  TempDir dir;
  const std::string path =
      testing::Rewrite(testing::OpenFixture(kFixtures / "bnb8.safetensors"), "", dir, [](auto* t, auto* d) {
        TensorToWrite& format = Named(t, "int8a.weight_format");
        d->emplace_back(format.data.begin(), format.data.end());
        d->back()[0] = std::byte{1};  // col32
        format.data = d->back();
      });
  const Checkpoint ckpt = testing::OpenFixture(path);
  CHECK(ckpt.Find("int8a.weight")->packed->bnb8->weight_format == 1);
  PlanOptions opt;
  opt.dtype = DType::kBF16;
  auto refused = Plan(ckpt, opt);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == StatusCode::kUnsupported);
  CHECK_THAT(std::string(refused.status().message()),
             Catch::Contains("'int8a.weight'") && Catch::Contains("weight_format 1"));
  opt.keep_packed = true;
  CHECK(Plan(ckpt, opt).ok());
}

TEST_CASE("bnb int8: an SCB without its weight, or of the wrong shape, is refused", "[bnb]") {
  const std::vector<testing::RefusedCase> cases = {
      {"no weight",
       testing::Without("int8a.weight"), StatusCode::kNotFound, "int8a."},
      {"short SCB",
       testing::Reshaped("int8a.SCB", {7}), StatusCode::kCorruption, "int8a."},
      {"a weight that is not int8",
       [](auto* t, auto*) { Named(t, "int8a.weight").dtype = DType::kU8; }, StatusCode::kCorruption,
       "int8a."},
  };
  testing::CheckRefused(testing::OpenFixture(kFixtures / "bnb8.safetensors"), "int8a.", cases);
}

// Counts the bytes each file of a load is asked for.
class CountingReader final : public io::ReaderWrapper {
 public:
  CountingReader(std::unique_ptr<io::Reader> inner, std::map<uint32_t, uint64_t>* bytes,
                 std::mutex* mu)
      : ReaderWrapper(std::move(inner)), bytes_(bytes), mu_(mu) {}
  void Submit(std::span<const io::ReadRequest> requests) override {
    {
      std::lock_guard lock(*mu_);
      for (const io::ReadRequest& r : requests) (*bytes_)[r.file] += r.length;
    }
    ReaderWrapper::Submit(requests);
  }

 private:
  std::map<uint32_t, uint64_t>* bytes_;
  std::mutex* mu_;
};

TEST_CASE("bnb4: a sharded checkpoint whose companions sit in the other shard loads unmerged",
          "[bnb]") {
  const Checkpoint ckpt = testing::OpenFixture(kFixtures / "sharded");
  REQUIRE(ckpt.files().size() == 2);
  const TensorInfo* nested = ckpt.Find("nested.weight");
  const TensorInfo* absmax = ckpt.Find("nested.weight.absmax");
  REQUIRE((nested->packed && absmax != nullptr));
  CHECK(nested->file != absmax->file);
  CHECK(ckpt.Find("fp4.weight")->file != ckpt.Find("fp4.weight.absmax")->file);
  const Checkpoint expected = testing::OpenFixture(kFixtures / "expected.safetensors");
  PlanOptions opt;
  opt.dtype = DType::kBF16;
  auto plan = Plan(ckpt, opt);
  REQUIRE(plan.ok());
  // The absmax is read before any piece of its weight, from whichever shard holds it.
  for (const TensorPlan& tp : plan->tensors) {
    if (tp.conversion != Conversion::kDequantBnb4) continue;
    size_t first_weight_read = plan->reads.size(), absmax_read = plan->reads.size();
    for (size_t r = 0; r < plan->reads.size(); ++r) {
      for (uint32_t t : plan->reads[r].tensors) {
        if (&plan->tensors[t] == &tp) first_weight_read = std::min(first_weight_read, r);
        if (t == tp.scale) absmax_read = std::min(absmax_read, r);
      }
    }
    CHECK(absmax_read < first_weight_read);
  }
  std::map<uint32_t, uint64_t> bytes;
  std::mutex mu;
  testing::ReaderSwitch counting([&](const std::vector<std::string>& paths,
                                     const io::ReaderOptions& options,
                                     std::string* log) -> Result<std::unique_ptr<io::Reader>> {
    LOADSTONE_ASSIGN_OR_RETURN(auto inner, io::OpenReader(paths, options, log));
    return std::unique_ptr<io::Reader>(new CountingReader(std::move(inner), &bytes, &mu));
  });
  Loader loader(counting.Options());
  LoadHandle load = loader.Load(ckpt, *plan);
  CheckDecoded(load, expected, "nested.weight", DType::kBF16);
  CheckDecoded(load, expected, "fp4.weight", DType::kBF16);
  REQUIRE(load.Done().get().ok());
  // Each shard's own tensors, read from that shard; none of it twice, nothing written elsewhere.
  for (uint32_t f = 0; f < 2; ++f) {
    uint64_t in_file = 0;
    for (const TensorInfo& t : ckpt.tensors()) in_file += t.file == f ? t.nbytes : 0;
    INFO("shard " << f);
    CHECK(bytes[f] >= in_file);
    CHECK(bytes[f] < in_file + 8192);  // at most alignment around the reads
  }
}

TEST_CASE(
    "bnb: on (simulated) GPUs a worker decodes, the device copies, the absmax stays on the host",
    "[bnb][sim]") {
  const DType dtype = GENERATE(DType::kBF16, DType::kF32);
  const std::string file = GENERATE("bnb4.safetensors", "bnb8.safetensors", "sharded");
  INFO(file << " into " << testing::DTypeSuffix(dtype));
  const Checkpoint ckpt = testing::OpenFixture(kFixtures / file);
  const Checkpoint expected = testing::OpenFixture(
      kFixtures / (file == "bnb8.safetensors" ? "expected8.safetensors" : "expected.safetensors"));
  PlanOptions opt;
  opt.dtype = dtype;
  opt.max_chunk = 4096;  // several pieces, each decoded and copied on its own
  opt.platform =
      Platform::Simulated(SimulatedMachine{{1ULL << 30, 1ULL << 30}, 8ULL << 30}.WithDevices());
  opt.device_map = "cuda:1";
  auto plan = Plan(ckpt, opt);
  INFO(plan.status().ToString());
  REQUIRE(plan.ok());
  size_t decoded = 0;
  for (uint32_t i = 0; i < plan->tensors.size(); ++i) {
    const TensorPlan& tp = plan->tensors[i];
    if (!Unpacks(tp.conversion)) continue;
    ++decoded;
    CHECK(plan->device_of(i) == Device::Cuda(1));
    CHECK(plan->device_of(tp.scale) == Device::Cpu());
  }
  // A worker decodes each piece into host memory for the device: no piece decodes to more than
  // max_chunk.
  for (const ReadChunk& r : plan->reads) {
    const TensorPlan& tp = plan->tensors[r.tensors.front()];
    if (!Unpacks(tp.conversion)) continue;
    const uint64_t per_byte = tp.conversion == Conversion::kDequantBnb4 ? 2 : 1;
    CHECK(r.length * per_byte * DTypeBits(dtype) / 8 <= opt.max_chunk);
  }
  CHECK(decoded > 0);
  LoaderOptions lo;
  lo.platform = opt.platform;
  Loader loader(lo);
  LoadHandle load = loader.Load(ckpt, *plan);
  const Status done = load.Done().get();
  INFO(done.ToString());
  REQUIRE(done.ok());
  for (const Tensor& t : load.Tensors()) {
    const TensorInfo* want = expected.Find(t.name() + "." + testing::DTypeSuffix(dtype));
    if (want == nullptr) continue;  // a quant-state tensor or a bias
    INFO(t.name());
    CHECK(t.device() == "cuda:1");
    CHECK(t.shape() == want->shape);
    CHECK(HostBytes(t) == FileBytes(expected, *want));
  }
}

TEST_CASE("bnb4: a weight whose scales share its bytes is refused, never waits for itself",
          "[bnb]") {
  const Checkpoint ckpt = testing::OpenFixture(kFixtures / "bnb4.safetensors");
  TensorInfo weight = *ckpt.Find("nf4.weight"), absmax = *ckpt.Find("nf4.weight.absmax");
  absmax.offset = weight.offset + 8;  // 24 bytes inside the weight's 192
  std::vector<TensorInfo> tensors = {weight, absmax};
  for (const std::string& c : weight.packed->companions()) {
    if (c != absmax.name) tensors.push_back(*ckpt.Find(c));
  }
  auto view = ckpt.WithTensors(tensors);
  REQUIRE(view.ok());
  PlanOptions opt;
  opt.dtype = DType::kF32;
  auto plan = Plan(*view, opt);
  REQUIRE_FALSE(plan.ok());
  CHECK(plan.status().code() == StatusCode::kUnsupported);
  CHECK_THAT(std::string(plan.status().message()), Catch::Contains("shares bytes"));
}

TEST_CASE("bnb4: an absmax smaller than the state says is refused before any read", "[bnb]") {
  const Checkpoint ckpt = testing::OpenFixture(kFixtures / "bnb4.safetensors");
  TensorInfo absmax = *ckpt.Find("nf4.weight.absmax");
  absmax.shape = {2};  // 6 blocks need 6
  absmax.nbytes = 8;
  std::vector<TensorInfo> tensors = {*ckpt.Find("nf4.weight"), absmax};
  for (const std::string& c : ckpt.Find("nf4.weight")->packed->companions()) {
    if (c != absmax.name) tensors.push_back(*ckpt.Find(c));
  }
  auto view = ckpt.WithTensors(tensors);
  REQUIRE(view.ok());
  PlanOptions opt;
  opt.dtype = DType::kF32;
  auto plan = Plan(*view, opt);
  REQUIRE(plan.ok());
  Loader loader;
  LoadHandle load = loader.Load(*view, *plan);
  const Status done = load.Done().get();
  CHECK(done.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(done.message()), Catch::Contains("does not fit it or its scales"));
}

TEST_CASE("bnb4: a catalog view without a weight's quant state is refused, not misread", "[bnb]") {
  const Checkpoint ckpt = testing::OpenFixture(kFixtures / "bnb4.safetensors");
  auto alone = ckpt.WithTensors({*ckpt.Find("nf4.weight")});  // packed, its absmax left out
  REQUIRE(alone.ok());
  PlanOptions opt;
  opt.dtype = DType::kF32;
  auto plan = Plan(*alone, opt);
  REQUIRE_FALSE(plan.ok());
  CHECK(plan.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(plan.status().message()), Catch::Contains("nf4.weight.absmax"));
}

void SetState(std::vector<TensorToWrite>* tensors, std::vector<std::vector<std::byte>>* data,
              const std::string& json) {
  TensorToWrite& state = Named(tensors, "nf4.weight.quant_state.bitsandbytes__nf4");
  data->emplace_back(reinterpret_cast<const std::byte*>(json.data()),
                     reinterpret_cast<const std::byte*>(json.data()) + json.size());
  state.data = data->back();
  state.shape = {json.size()};
}

TEST_CASE("bnb4: a hostile quant state is refused naming the tensor", "[bnb]") {
  const nlohmann::json good = {
      {"quant_type", "nf4"}, {"blocksize", 64}, {"dtype", "bfloat16"}, {"shape", {16, 24}}};
  auto with = [&](const std::string& key, const nlohmann::json& value) {
    nlohmann::json doc = good;
    doc[key] = value;
    return doc.dump();
  };
  auto nested = [&](double offset) {  // the good state, declared nested (double quantization)
    nlohmann::json doc = good;
    doc["nested_blocksize"] = 256;
    doc["nested_dtype"] = "float32";
    doc["nested_offset"] = offset;
    return doc.dump();
  };
  const std::vector<testing::RefusedCase> cases = {
      {"not JSON", [](auto* t, auto* d) { SetState(t, d, "{\"quant_type\": "); },
       StatusCode::kCorruption, "nf4.weight.quant_state"},
      {"blocksize 48", [&](auto* t, auto* d) { SetState(t, d, with("blocksize", 48)); },
       StatusCode::kCorruption, "blocksize"},
      {"fp4 under an nf4 name",
       [&](auto* t, auto* d) { SetState(t, d, with("quant_type", "fp4")); },
       StatusCode::kCorruption, "quant_type 'fp4'"},
      {"a dtype bnb never writes", [&](auto* t, auto* d) { SetState(t, d, with("dtype", "int8")); },
       StatusCode::kCorruption, "dtype"},
      {"a shape the bytes do not hold",
       [&](auto* t, auto* d) {
         SetState(t, d, with("shape", {16, 25}));
       },
       StatusCode::kCorruption, "its quant state's shape needs 200"},
      {"a shape that overflows",
       [&](auto* t, auto* d) {
         SetState(t, d, with("shape", {uint64_t{1} << 40, uint64_t{1} << 40}));
       },
       StatusCode::kCorruption, "2^62"},
      {"a nested offset beyond float32", [&](auto* t, auto* d) { SetState(t, d, nested(1e300)); },
       StatusCode::kCorruption, "finite float32"},
      {"nested without its tables",  // nested, but the absmax is f32 and no nested tables exist
       [&](auto* t, auto* d) { SetState(t, d, nested(0.5)); }, StatusCode::kCorruption,
       "nf4.weight.absmax"},
      {"no absmax",
       testing::Without("nf4.weight.absmax"), StatusCode::kNotFound, "nf4.weight.absmax"},
      {"absmax too short",
       testing::Reshaped("nf4.weight.absmax", {5}), StatusCode::kCorruption, "needs float32 of 6"},
      {"a quant_map that is not NF4",
       [](auto* t, auto* d) {
         TensorToWrite& m = Named(t, "nf4.weight.quant_map");
         d->emplace_back(m.data.begin(), m.data.end());
         const float other = 0.5f;
         std::memcpy(d->back().data() + 4, &other, 4);
         m.data = d->back();
       },
       StatusCode::kCorruption, "code 1"},
      {"no weight",
       testing::Without("nf4.weight"), StatusCode::kNotFound, "'nf4.weight'"},
  };
  // One weight and its state ("nf4.weight*"), edited.
  testing::CheckRefused(testing::OpenFixture(kFixtures / "bnb4.safetensors"), "nf4.weight", cases);
}

}  // namespace
}  // namespace loadstone
