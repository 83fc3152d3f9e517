// loadstone launch -n N [--master-port P] [--timeout S] -- load MODEL --tp N ...
// Runs N ranks of a loadstone command on this machine, as torchrun does: each a process of this
// binary with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1 and MASTER_PORT set. Each rank's
// error lines come to stderr as they are written, prefixed "[rank R] "; their standard outputs
// come once all have ended, in rank order (with --json, one document: {"ranks": [...]}).
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tools/loadstone/commands.h"
#include "tools/loadstone/format.h"

namespace loadstone::cli {
namespace {

struct LaunchArgs {
  int ranks = 1;
  int master_port = 0;  // 0: a free one
  double timeout_s = 600;
  std::vector<std::string> command;
};

struct Rank {
  pid_t pid = -1;
  int out = -1;  // its stdout, then its stderr
  int err = -1;
  std::string stdout_text;
  std::string stderr_line;  // a line not yet ended
  int exit_code = -1;
};

// A port free on 127.0.0.1 now (the kernel's pick for port 0).
Result<int> FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::IOError("cannot open a socket to find a free port");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  close(fd);
  if (!ok) return Status::IOError("cannot find a free port on 127.0.0.1; give --master-port");
  return static_cast<int>(ntohs(addr.sin_port));
}

Status Spawn(const LaunchArgs& args, int port, int r, Rank* rank) {
  int out[2];
  int err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    return Status::IOError("cannot make a pipe for a rank's output");
  }
  const pid_t pid = fork();
  if (pid < 0) return Status::IOError("cannot start a rank (fork failed)");
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    setenv("RANK", std::to_string(r).c_str(), 1);
    setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
    setenv("WORLD_SIZE", std::to_string(args.ranks).c_str(), 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    std::vector<char*> argv = {const_cast<char*>("loadstone")};
    for (const std::string& a : args.command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  rank->pid = pid;
  rank->out = out[0];
  rank->err = err[0];
  return Status::OK();
}

// Reads what is there on `fd` into the rank: stdout kept, stderr forwarded line by line.
bool Drain(int fd, int r, Rank& rank, bool is_err) {
  char buffer[65536];
  const ssize_t n = read(fd, buffer, sizeof buffer);
  if (n <= 0) return false;
  if (!is_err) {
    rank.stdout_text.append(buffer, n);
    return true;
  }
  rank.stderr_line.append(buffer, n);
  for (size_t nl; (nl = rank.stderr_line.find('\n')) != std::string::npos;) {
    std::cerr << "[rank " << r << "] " << rank.stderr_line.substr(0, nl + 1);
    rank.stderr_line.erase(0, nl + 1);
  }
  return true;
}

// Waits for every rank, forwarding their output; kills them all past the timeout.
bool WaitAll(std::vector<Rank>& ranks, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<std::pair<int, bool>> who;  // rank, is_err
    for (size_t r = 0; r < ranks.size(); ++r) {
      if (ranks[r].out >= 0) fds.push_back({ranks[r].out, POLLIN, 0}), who.push_back({r, false});
      if (ranks[r].err >= 0) fds.push_back({ranks[r].err, POLLIN, 0}), who.push_back({r, true});
    }
    if (fds.empty()) break;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    if (poll(fds.data(), fds.size(), static_cast<int>(std::min<int64_t>(left.count(), 1000))) < 0) {
      continue;  // EINTR
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Rank& rank = ranks[who[i].first];
      int& fd = who[i].second ? rank.err : rank.out;
      if (!Drain(fd, who[i].first, rank, who[i].second)) close(fd), fd = -1;
    }
  }
  for (Rank& rank : ranks) {
    int status = 0;
    waitpid(rank.pid, &status, 0);
    rank.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  return true;
}

int Report(const LaunchArgs& args, const std::vector<Rank>& ranks) {
  const bool json = std::find(args.command.begin(), args.command.end(), "--json") !=
                    args.command.end();
  int code = 0;
  for (const Rank& rank : ranks) code = code != 0 ? code : rank.exit_code;
  if (!json) {
    for (size_t r = 0; r < ranks.size(); ++r) {
      std::string text = ranks[r].stdout_text;
      for (size_t at = 0; at < text.size();) {
        const size_t nl = text.find('\n', at);
        const size_t end = nl == std::string::npos ? text.size() : nl + 1;
        std::cout << "[rank " << r << "] " << text.substr(at, end - at);
        at = end;
      }
    }
    return code;
  }
  nlohmann::ordered_json doc;
  auto& list = doc["ranks"] = nlohmann::ordered_json::array();
  for (const Rank& rank : ranks) {
    auto parsed = nlohmann::ordered_json::parse(rank.stdout_text, nullptr, false);
    list.push_back(parsed.is_discarded() ? nlohmann::ordered_json(nullptr) : parsed);
  }
  doc["exit_codes"] = nlohmann::ordered_json::array();
  for (const Rank& rank : ranks) doc["exit_codes"].push_back(rank.exit_code);
  std::cout << doc.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
  return code;
}

int RunLaunch(const LaunchArgs& args) {
  int port = args.master_port;
  if (port == 0) {
    auto free = FreePort();
    if (!free.ok()) return ReportError(free.status());
    port = *free;
  }
  std::vector<Rank> ranks(args.ranks);
  for (int r = 0; r < args.ranks; ++r) {
    if (Status s = Spawn(args, port, r, &ranks[r]); !s.ok()) {
      for (int q = 0; q < r; ++q) kill(ranks[q].pid, SIGKILL), waitpid(ranks[q].pid, nullptr, 0);
      return ReportError(s);
    }
  }
  if (!WaitAll(ranks, args.timeout_s)) {
    for (Rank& rank : ranks) kill(rank.pid, SIGKILL), waitpid(rank.pid, nullptr, 0);
    return ReportError(Status::IOError(fmt::format(
        "the {} ranks did not all end within --timeout {} s: all were killed", args.ranks,
        args.timeout_s)));
  }
  return Report(args, ranks);
}

}  // namespace

void AddLaunchCommand(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<LaunchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "launch", "Run N ranks of a command on this machine (torchrun's environment, 127.0.0.1)");
  cmd->add_option("-n,--nproc", args->ranks, "Ranks to run")->required()->check(
      CLI::Range(1, 1024));
  cmd->add_option("--master-port", args->master_port,
                  "The port rank 0's store listens on, on 127.0.0.1 (default: a free one)")
      ->check(CLI::Range(1, 65535));
  cmd->add_option("--timeout", args->timeout_s,
                  "Seconds before every rank still running is killed (default 600)")
      ->check(CLI::Range(1.0, 86400.0));
  cmd->add_option("command", args->command,
                  "The loadstone command each rank runs, after --: load MODEL --tp N ...")
      ->required();
  cmd->callback([args, exit_code] { *exit_code = RunLaunch(*args); });
}

}  // namespace loadstone::cli
