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

extern char** environ;

#include <algorithm>
#include <cerrno>
#include <optional>
#include <utility>
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

// The environment of rank r: this process's, with torchrun's variables set.
std::vector<std::string> RankEnvironment(const LaunchArgs& args, int port, int r) {
  const std::vector<std::pair<std::string, std::string>> set = {
      {"RANK", std::to_string(r)},          {"LOCAL_RANK", std::to_string(r)},
      {"WORLD_SIZE", std::to_string(args.ranks)}, {"MASTER_ADDR", "127.0.0.1"},
      {"MASTER_PORT", std::to_string(port)}};
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const bool replaced = std::any_of(set.begin(), set.end(), [&](const auto& kv) {
      return entry.starts_with(kv.first + "=");
    });
    if (!replaced) env.emplace_back(entry);
  }
  for (const auto& [k, v] : set) env.push_back(k + "=" + v);
  return env;
}

// Starts rank r; everything the child needs is made before the fork.
Status Spawn(const LaunchArgs& args, int port, int r, Rank* rank) {
  std::vector<std::string> env = RankEnvironment(args, port, r);
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<char*> argv = {const_cast<char*>("loadstone")};
  for (const std::string& a : args.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  int out[2];
  int err[2];
  if (pipe2(out, O_CLOEXEC) != 0) return Status::IOError("cannot make a pipe for a rank");
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]), close(out[1]);
    return Status::IOError("cannot make a pipe for a rank");
  }
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    execve("/proc/self/exe", argv.data(), envp.data());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  if (pid < 0) {
    close(out[0]), close(err[0]);
    return Status::IOError("cannot start a rank (fork failed)");
  }
  rank->pid = pid;
  rank->out = out[0];
  rank->err = err[0];
  return Status::OK();
}

// Reads what is there on `fd` into the rank: stdout kept, stderr forwarded line by line (the
// last line, unended, at the end). False at the end of its output.
bool Drain(int fd, int r, Rank& rank, bool is_err) {
  char buffer[65536];
  const ssize_t n = read(fd, buffer, sizeof buffer);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (n <= 0) {
    if (is_err && !rank.stderr_line.empty()) {
      std::cerr << "[rank " << r << "] " << rank.stderr_line << "\n";
      rank.stderr_line.clear();
    }
    return false;
  }
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

volatile sig_atomic_t g_signal = 0;  // SIGINT or SIGTERM sent to the launcher

// Reaps the ranks that have ended (their exit code, or 128 + the signal).
void Reap(std::vector<Rank>& ranks) {
  for (Rank& rank : ranks) {
    int status = 0;
    if (rank.exit_code >= 0 || waitpid(rank.pid, &status, WNOHANG) != rank.pid) continue;
    rank.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
}

void Signal(std::vector<Rank>& ranks, int sig) {
  for (Rank& rank : ranks) {
    if (rank.exit_code < 0) kill(rank.pid, sig);
  }
}

// Forwards the ranks' output until every rank has ended. A signal to the launcher is sent on
// to them; once one rank has failed, the others get 3 s to end on their own (they usually learn
// of it from c10d), then SIGTERM, as torchrun does. False past the deadline.
bool WaitAll(std::vector<Rank>& ranks, double timeout_s) {
  using Clock = std::chrono::steady_clock;
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  std::optional<Clock::time_point> failed_at;
  bool terminated = false;
  for (;;) {
    Reap(ranks);
    if (g_signal != 0) Signal(ranks, std::exchange(g_signal, 0));
    const bool failed = std::any_of(ranks.begin(), ranks.end(),
                                    [](const Rank& r) { return r.exit_code > 0; });
    if (failed && !failed_at) failed_at = Clock::now();
    if (failed_at && !terminated && Clock::now() - *failed_at > std::chrono::seconds(3)) {
      Signal(ranks, SIGTERM);
      terminated = true;
    }
    std::vector<pollfd> fds;
    std::vector<std::pair<int, bool>> who;  // rank, is_err
    for (size_t r = 0; r < ranks.size(); ++r) {
      if (ranks[r].out >= 0) fds.push_back({ranks[r].out, POLLIN, 0}), who.push_back({r, false});
      if (ranks[r].err >= 0) fds.push_back({ranks[r].err, POLLIN, 0}), who.push_back({r, true});
    }
    const bool ended = std::all_of(ranks.begin(), ranks.end(),
                                   [](const Rank& r) { return r.exit_code >= 0; });
    if (fds.empty() && ended) return true;
    if (Clock::now() >= deadline) return false;
    if (poll(fds.data(), fds.size(), 100) <= 0) continue;  // a timeout, EINTR
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Rank& rank = ranks[who[i].first];
      int& fd = who[i].second ? rank.err : rank.out;
      if (!Drain(fd, who[i].first, rank, who[i].second)) close(fd), fd = -1;
    }
  }
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
      for (int q = 0; q < r; ++q) {
        kill(ranks[q].pid, SIGKILL), waitpid(ranks[q].pid, nullptr, 0);
        close(ranks[q].out), close(ranks[q].err);
      }
      return ReportError(s);
    }
  }
  struct sigaction forward{};
  forward.sa_handler = [](int sig) { g_signal = sig; };
  sigaction(SIGINT, &forward, nullptr);
  sigaction(SIGTERM, &forward, nullptr);
  if (!WaitAll(ranks, args.timeout_s)) {
    for (Rank& rank : ranks) {
      if (rank.exit_code < 0) kill(rank.pid, SIGKILL), waitpid(rank.pid, nullptr, 0);
      if (rank.out >= 0) close(rank.out);
      if (rank.err >= 0) close(rank.err);
    }
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
