// The CLI's readers of flag values — dtypes, sizes, budgets, lists — one each, shared by every
// command, with errors that name the flag and the item at fault.
#ifndef LOADSTONE_TOOLS_PARSE_H_
#define LOADSTONE_TOOLS_PARSE_H_

#include <string>
#include <string_view>
#include <vector>

#include "loadstone/device_map.h"
#include "loadstone/dtype.h"
#include "loadstone/platform.h"
#include "loadstone/status.h"

namespace loadstone::cli {

// The spellings `--dtype` takes, for --help and errors.
inline constexpr const char* kCastTargetSpellings =
    "f32 (float32, fp32, float), f16 (float16, fp16, half) or bf16 (bfloat16); torch. prefixes "
    "and safetensors names (F32, F16, BF16) also work";

// A cast target. Errors: InvalidArgument naming `flag` and the accepted spellings, for an
// unknown name and for a known dtype that is not a target (f64, fp8, int8, ...).
Result<DType> ParseCastTarget(std::string_view text, std::string_view flag);

// A size string as accelerate reads one ("10GiB", "5GB"), or digits (bytes). A lowercase final
// 'b' with a decimal unit means bits, as in accelerate; that is said in *warning (when given).
// `label` names the flag and value in messages ("--staging 64MiB", "--max-memory cpu=10GB").
// Errors: InvalidArgument.
Result<uint64_t> ParseSizeFlag(std::string_view text, std::string_view label,
                               std::string* warning = nullptr);

// --max-memory "0=10GiB, 1=10GiB, cpu=30GiB": items split at commas, spaces around items and
// '=' ignored; keys are devices (0, cuda:0, mps, cpu, disk), values sizes (ParseSizeFlag).
// Errors: InvalidArgument naming the item: not KEY=SIZE, an unknown device, a bad size, a
// device given twice. Bit-unit warnings go to *warnings.
Result<MaxMemory> ParseMaxMemoryFlag(std::string_view text, std::vector<std::string>* warnings);

// The values of a repeatable option, each also split at commas ("norm,lm_head"); spaces
// around items dropped, empty items skipped.
std::vector<std::string> SplitLists(const std::vector<std::string>& values);

inline constexpr uint64_t kMaxAssumedGpus = 64;

// --assume-gpus "2x80GiB" (or "2×80GiB"): COUNT GPUs (0 to kMaxAssumedGpus) of SIZE each. A size
// in bits ("80gb") or without a unit (bytes) is said in *warnings. Errors: InvalidArgument.
Result<SimulatedMachine> ParseAssumeGpus(std::string_view text,
                                         std::vector<std::string>* warnings = nullptr);

// --fp8-block "128,128" (or "128x128"). Errors: InvalidArgument.
Result<std::array<uint64_t, 2>> ParseBlockFlag(std::string_view text, std::string_view flag);

// The whole text of the file a flag names ("--tp-plan FILE.json"). Errors: NotFound (no such
// regular file), IOError (unreadable), each naming the flag and the path.
Result<std::string> ReadFlagFile(std::string_view flag, const std::string& path);

}  // namespace loadstone::cli

#endif  // LOADSTONE_TOOLS_PARSE_H_
