#include "tools/loadstone/output.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

namespace loadstone::cli {
namespace {

namespace fs = std::filesystem;

struct Identity {
  dev_t dev = 0;
  ino_t ino = 0;
  bool operator==(const Identity&) const = default;
};

std::optional<Identity> IdentityOf(const fs::path& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return Identity{st.st_dev, st.st_ino};
}

// `path` with its symlinks and ".." resolved as far as it exists, absolute.
fs::path Resolved(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  if (ec) p = fs::absolute(path, ec).lexically_normal();
  if (p.has_parent_path() && p.filename().empty()) p = p.parent_path();  // "dir/" → "dir"
  return p;
}

// The folders above `path` that exist, innermost first.
std::vector<Identity> FoldersAbove(const fs::path& path) {
  std::vector<Identity> out;
  for (fs::path p = path.parent_path();; p = p.parent_path()) {
    if (auto id = IdentityOf(p)) out.push_back(*id);
    if (p == p.parent_path()) break;
  }
  return out;
}

std::string FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISREG(mode)) return "a file";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a named pipe";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "a special file";
}

// The process's umask, read without changing it (umask(2) would, for every thread).
mode_t Umask() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.starts_with("Umask:")) return static_cast<mode_t>(std::stoul(line.substr(6), nullptr, 8));
  }
  return 022;
}

Status Errno(int err, const std::string& what) {
  return Status::IOError(fmt::format("{}: {}", what, std::strerror(err)));
}

}  // namespace

Status RefuseInputAsOutput(const std::string& output, const std::vector<std::string>& inputs,
                           const std::string& what) {
  const fs::path out = Resolved(output);
  const std::optional<Identity> out_id = IdentityOf(out);
  std::vector<std::pair<const std::string*, Identity>> in_ids;
  for (const std::string& input : inputs) {
    if (auto id = input.empty() ? std::nullopt : IdentityOf(input)) in_ids.emplace_back(&input, *id);
  }
  for (const auto& [input, id] : in_ids) {
    if (out_id == id) {
      return Status::InvalidArgument(fmt::format(
          "{} '{}' is the input '{}' (the same file or folder on disk): writing it would "
          "destroy what is read; give {} a path outside the input",
          what, output, *input, what));
    }
  }
  for (const Identity& folder : FoldersAbove(out)) {
    for (const auto& [input, id] : in_ids) {
      if (folder == id) {
        return Status::InvalidArgument(fmt::format(
            "{} '{}' lies inside the input folder '{}': writing there would change the input "
            "while it is read; give {} a path outside it",
            what, output, *input, what));
      }
    }
  }
  if (!out_id) return Status::OK();
  for (const auto& [input, id] : in_ids) {
    for (const Identity& folder : FoldersAbove(Resolved(*input))) {
      if (folder == *out_id) {
        return Status::InvalidArgument(fmt::format(
            "{} '{}' holds the input '{}': replacing it would destroy what is read; give {} a "
            "path outside the input",
            what, output, *input, what));
      }
    }
  }
  return Status::OK();
}

Result<std::unique_ptr<StagedOutput>> StagedOutput::Begin(const std::string& target,
                                                          Options options) {
  std::unique_ptr<StagedOutput> out(new StagedOutput());
  out->options_ = std::move(options);
  const bool folder = out->options_.kind == Kind::kFolder;
  const std::string& what = out->options_.what;
  out->target_ = Resolved(target).string();
  struct stat st{};
  if (::lstat(out->target_.c_str(), &st) == 0) {
    const bool empty_dir = S_ISDIR(st.st_mode) && fs::is_empty(out->target_);
    if (!(folder && empty_dir)) {
      if ((folder && !S_ISDIR(st.st_mode)) || (!folder && !S_ISREG(st.st_mode))) {
        return Status::InvalidArgument(fmt::format(
            "{} '{}' is {}, where {} is written: it is left as it is; give another path", what,
            target, FileKind(st.st_mode), folder ? "a folder" : "a file"));
      }
      if (!out->options_.may_replace) {
        return Status::InvalidArgument(fmt::format(
            "{} '{}' already exists: it is left as it is; give a path that does not exist",
            what, target));
      }
      LOADSTONE_RETURN_IF_ERROR(out->options_.may_replace(out->target_));
    }
    out->replace_ = true;
  } else if (errno != ENOENT) {
    return Errno(errno, fmt::format("{} '{}': cannot look at it", what, target));
  }

  const fs::path parent = fs::path(out->target_).parent_path();
  std::vector<fs::path> missing;
  for (fs::path p = parent; !fs::exists(p) && p != p.parent_path(); p = p.parent_path()) {
    missing.push_back(p);
  }
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    if (::mkdir(it->c_str(), 0755) != 0) {
      return Errno(errno, fmt::format("{}: cannot create the folder '{}'", what, it->string()));
    }
    out->made_dirs_.push_back(it->string());
  }
  std::string temp =
      (parent / fmt::format(".{}.loadstone-XXXXXX", fs::path(out->target_).filename().string()))
          .string();
  // mkdtemp and mkostemp make 0700 and 0600; the output gets what mkdir and creat would give.
  if (folder) {
    if (::mkdtemp(temp.data()) == nullptr) {
      return Errno(errno, fmt::format("{}: cannot create a folder in '{}'", what, parent.string()));
    }
    ::chmod(temp.c_str(), 0777 & ~Umask());
  } else {
    const int fd = ::mkostemp(temp.data(), O_CLOEXEC);
    if (fd < 0) {
      return Errno(errno, fmt::format("{}: cannot create a file in '{}'", what, parent.string()));
    }
    ::fchmod(fd, 0666 & ~Umask());
    ::close(fd);
  }
  out->temp_ = std::move(temp);
  return out;
}

StagedOutput::~StagedOutput() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(temp_, ec);  // made by Begin, filled by this command only
  for (auto it = made_dirs_.rbegin(); it != made_dirs_.rend(); ++it) ::rmdir(it->c_str());
}

std::vector<std::string> StagedOutput::AtTarget(const std::vector<std::string>& written) const {
  std::vector<std::string> out;
  for (const std::string& p : written) {
    out.push_back(p.starts_with(temp_) ? target_ + p.substr(temp_.size()) : p);
  }
  return out;
}

Status StagedOutput::Commit() {
  const std::string& what = options_.what;
  if (!replace_) {  // nothing there when Begin looked: nothing may be replaced now either
    if (::renameat2(AT_FDCWD, temp_.c_str(), AT_FDCWD, target_.c_str(), RENAME_NOREPLACE) != 0) {
      if (errno == EEXIST) {
        return Status::InvalidArgument(fmt::format(
            "{} '{}' appeared while this command wrote it: it is left as it is", what, target_));
      }
      return Errno(errno, fmt::format("{}: cannot move '{}' to '{}'", what, temp_, target_));
    }
  } else if (options_.kind == Kind::kFile) {
    if (::rename(temp_.c_str(), target_.c_str()) != 0) {
      return Errno(errno, fmt::format("{}: cannot move '{}' to '{}'", what, temp_, target_));
    }
  } else {
    // The folders trade places at once; the old one, now under the temporary name, goes after.
    if (::renameat2(AT_FDCWD, temp_.c_str(), AT_FDCWD, target_.c_str(), RENAME_EXCHANGE) != 0) {
      return Errno(errno, fmt::format("{}: cannot move '{}' to '{}'", what, temp_, target_));
    }
    std::error_code ec;
    fs::remove_all(temp_, ec);
  }
  committed_ = true;
  return Status::OK();
}

Status OnlyCheckpointFiles(const std::string& folder) {
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(folder, ec)) {
    const std::string name = e.path().filename().string();
    const bool ours = e.is_regular_file(ec) &&
                      (name.ends_with(".safetensors") || name == "config.json" ||
                       (name.find(".safetensors.index") != std::string::npos &&
                        name.ends_with(".json")));
    if (!ours) {
      return Status::InvalidArgument(fmt::format(
          "'{}' holds '{}', which convert does not write, so --overwrite does not replace the "
          "folder: it is left as it is; give a new or empty folder",
          folder, name));
    }
  }
  if (ec) return Errno(ec.value(), fmt::format("cannot list '{}'", folder));
  return Status::OK();
}

}  // namespace loadstone::cli
