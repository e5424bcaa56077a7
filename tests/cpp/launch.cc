// A plain launcher, as a user's script or job system would be: starts N copies
// of a command with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1 and a
// free MASTER_PORT, and waits for them with a deadline. A failing copy gives
// the others a grace period to fail on their own (ringdist turns a lost peer
// into an error), then the rest are killed; so is everything at the deadline.
//
//   ringdist_launch --nproc 3 [--timeout 120] -- ./program args...
//   ringdist_launch --port-only -- mpirun -n 2 ./program   (sets MASTER_* and runs it once)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr auto kGrace = std::chrono::seconds(15);

int freePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::perror("ringdist_launch: no free port");
    std::exit(2);
  }
  close(fd);
  return ntohs(addr.sin_port);
}

int usage() {
  std::fprintf(stderr, "usage: ringdist_launch (--nproc N | --port-only) [--timeout SECONDS] -- command...\n");
  return 2;
}

int exitCodeOf(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

int main(int argc, char** argv) {
  int nproc = 0;
  bool portOnly = false;
  int timeoutSeconds = 120;
  int i = 1;
  for (; i < argc && std::strcmp(argv[i], "--") != 0; ++i) {
    if (std::strcmp(argv[i], "--nproc") == 0 && i + 1 < argc) {
      nproc = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--port-only") == 0) {
      portOnly = true;
    } else if (std::strcmp(argv[i], "--timeout") == 0 && i + 1 < argc) {
      timeoutSeconds = std::atoi(argv[++i]);
    } else {
      return usage();
    }
  }
  if (i + 1 >= argc || (nproc < 1 && !portOnly) || timeoutSeconds < 1) {
    return usage();
  }
  char** command = argv + i + 1;
  const std::string port = std::to_string(freePort());
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", port.c_str(), 1);
  if (portOnly) {
    nproc = 1;
  }

  std::vector<pid_t> children;
  for (int rank = 0; rank < nproc; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      if (!portOnly) {
        setenv("RANK", std::to_string(rank).c_str(), 1);
        setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
        setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
      }
      execvp(command[0], command);
      std::perror("ringdist_launch: exec");
      _exit(127);
    }
    children.push_back(pid);
  }

  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::seconds(timeoutSeconds);
  auto killAt = Clock::time_point::max();
  int result = 0;
  size_t running = children.size();
  while (running > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      --running;
      const int code = exitCodeOf(status);
      if (code != 0 && result == 0) {
        result = code;
        killAt = Clock::now() + kGrace;
        std::fprintf(stderr, "ringdist_launch: a copy exited with %d\n", code);
      }
      continue;
    }
    const auto now = Clock::now();
    if (now >= deadline || now >= killAt) {
      if (now >= deadline) {
        std::fprintf(stderr, "ringdist_launch: killed after %d s\n", timeoutSeconds);
        result = 124;
      }
      for (pid_t child : children) kill(child, SIGKILL);
      while (waitpid(-1, &status, 0) > 0) {
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return result;
}
