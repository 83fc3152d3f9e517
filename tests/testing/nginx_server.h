// An nginx (Debian's) serving a folder on 127.0.0.1 for the remote-reading tests: started by
// the test on a free port, one process in the foreground (no daemon, nothing written outside
// its own scratch folder), stopped (SIGTERM, then SIGKILL) when the object goes. Every wait is
// bounded. Routes besides the folder itself (byte ranges on):
//   /moved/NAME    302 to /NAME (as the Hub's resolve/ URLs redirect to its CDN)
//   /norange/NAME  NAME without byte ranges (a 200 with the whole object to a Range request)
//   /hub/test/fixtures/resolve/main/NAME (or resolve/<kHubCommit>/NAME)
//                  the Hub's resolve/ route of repository test/fixtures (the folder), for a
//                  request with "Authorization: Bearer <kHubToken>" (else 401): weights
//                  (.safetensors, .bin, .gguf) 302 to http://localhost:PORT/cdn/NAME (another
//                  host name, as the Hub's CDN is) with X-Linked-Etag "linked-BASENAME" and
//                  X-Repo-Commit kHubCommit; other files served in place with X-Repo-Commit.
//                  Another revision: 404.
//   /cdn/NAME      NAME, refused (400) to a request that carries an Authorization header: the
//                  Hub's token must not reach its CDN.
// With `tls`, the folder is also served over https with HTTP/2 on a second port (TlsUrl), with a
// certificate for 127.0.0.1 made for the server by openssl (its CA: cert_path()).
#ifndef LOADSTONE_TESTS_TESTING_NGINX_SERVER_H_
#define LOADSTONE_TESTS_TESTING_NGINX_SERVER_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "testing/temp_dir.h"

namespace loadstone::testing {

inline constexpr const char* kHubToken = "hf_loadstone_test_token";
inline constexpr const char* kHubCommit = "0123456789abcdef0123456789abcdef01234567";

class NginxServer {
 public:
  // nginx serving `root` (one process, this user: it reads what the test can), or nullptr with
  // `why` set when there is no nginx or it would not start.
  static std::unique_ptr<NginxServer> Start(const std::string& root, std::string* why,
                                            bool tls = false) {
    const std::string binary = Find();
    if (binary.empty()) {
      *why = "no nginx on this machine (scripts/setup.sh installs Debian's)";
      return nullptr;
    }
    for (int attempt = 0; attempt < 3; ++attempt) {  // a free port can be taken meanwhile
      auto server = std::unique_ptr<NginxServer>(new NginxServer());
      if (tls && !server->MakeCertificate(why)) return nullptr;
      if (server->Launch(binary, root, why)) return server;
    }
    return nullptr;
  }

  ~NginxServer() { Stop(); }

  int port() const { return port_; }
  std::string Url(const std::string& path) const {
    return fmt::format("http://127.0.0.1:{}/{}", port_, path);
  }
  std::string TlsUrl(const std::string& path) const {
    return fmt::format("https://127.0.0.1:{}/{}", tls_port_, path);
  }
  std::string cert_path() const { return prefix_.Path("cert.pem"); }
  // Stops the server now (the tests of a server that goes away); bounded: 5 s, then SIGKILL.
  void Stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 500; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  NginxServer() = default;

  static std::string Find() {
    for (const char* p : {"/usr/sbin/nginx", "/usr/bin/nginx"}) {
      if (::access(p, X_OK) == 0) return p;
    }
    return std::string();
  }

  static int FreePort() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    int port = -1;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port = ntohs(addr.sin_port);
    }
    ::close(fd);
    return port;
  }

  static bool Accepts(int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return false;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    ::close(fd);
    return ok;
  }

  // A self-signed certificate for 127.0.0.1 (openssl req), for the https listener.
  bool MakeCertificate(std::string* why) {
    const std::string command = fmt::format(
        "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=127.0.0.1 -addext "
        "subjectAltName=IP:127.0.0.1 -keyout {} -out {} >/dev/null 2>&1",
        prefix_.Path("key.pem"), cert_path());
    if (std::system(command.c_str()) != 0) {
      *why = "openssl could not make a certificate (scripts/setup.sh installs openssl)";
      return false;
    }
    tls_port_ = 0;
    return true;
  }

  // The https server block, when there is a certificate.
  std::string TlsServer(const std::string& root) {
    if (tls_port_ < 0) return std::string();
    tls_port_ = FreePort();
    return fmt::format(
        "  server {{ listen 127.0.0.1:{} ssl http2; ssl_certificate {}; ssl_certificate_key {}; "
        "root {}; }}\n",
        tls_port_, cert_path(), prefix_.Path("key.pem"), root);
  }

  bool Launch(const std::string& binary, const std::string& root, std::string* why) {
    port_ = FreePort();
    if (port_ <= 0) {
      *why = "no free port on 127.0.0.1";
      return false;
    }
    const std::string p = prefix_.path();
    const std::string tls = TlsServer(root);
    const std::string conf = fmt::format(R"(daemon off;
master_process off;
worker_processes 1;
pid {0}/nginx.pid;
error_log {0}/error.log;
events {{ worker_connections 512; }}
http {{
  access_log off;
  client_body_temp_path {0}/body;
  proxy_temp_path {0}/proxy;
  fastcgi_temp_path {0}/fastcgi;
  uwsgi_temp_path {0}/uwsgi;
  scgi_temp_path {0}/scgi;
  default_type application/octet-stream;
  sendfile on;
  keepalive_requests 100000;
  server {{
    listen 127.0.0.1:{1};
    root {2};
    location /moved/ {{ rewrite ^/moved/(.*)$ /$1 redirect; }}
    location /norange/ {{ max_ranges 0; alias {2}/; }}
    location ~ ^/hub/test/fixtures/resolve/(?:main|{4})/((?:.*/)?([^/]+\.(?:safetensors|bin|gguf)))$ {{
      if ($http_authorization != "Bearer {3}") {{ return 401; }}
      add_header X-Linked-Etag "\"linked-$2\"" always;
      add_header X-Repo-Commit {4} always;
      return 302 http://localhost:{1}/cdn/$1;
    }}
    location /cdn/ {{
      if ($http_authorization != "") {{ return 400; }}
      alias {2}/;
    }}
    location ~ ^/hub/test/fixtures/resolve/(?:main|{4})/(.+)$ {{
      if ($http_authorization != "Bearer {3}") {{ return 401; }}
      add_header X-Repo-Commit {4} always;
      alias {2}/$1;
    }}
  }}
{5}}}
)",
                                         p, port_, root, kHubToken, kHubCommit, tls);
    std::ofstream(p + "/nginx.conf") << conf;
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::execl(binary.c_str(), binary.c_str(), "-p", p.c_str(), "-c", (p + "/nginx.conf").c_str(),
              "-e", (p + "/error.log").c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    if (pid < 0) {
      *why = "fork failed";
      return false;
    }
    pid_ = pid;
    for (int i = 0; i < 500; ++i) {  // 5 s
      if (Accepts(port_) && (tls_port_ <= 0 || Accepts(tls_port_))) return true;
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {  // it exited: the port, or its config
        pid_ = -1;
        std::ifstream log(p + "/error.log");
        *why = std::string("nginx did not start: ") +
               std::string(std::istreambuf_iterator<char>(log), {});
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    *why = "nginx did not listen within 5 s";
    Stop();
    return false;
  }

  TempDir prefix_;
  int port_ = -1;
  int tls_port_ = -1;  // -1: no https listener
  pid_t pid_ = -1;
};

}  // namespace loadstone::testing

#endif  // LOADSTONE_TESTS_TESTING_NGINX_SERVER_H_
