// The process tree as /proc shows it, for the step supervisor (which kills
// what a step left below it) and the agent (which kills what a killed
// supervisor left, and a kept step it cannot take back). Header-only and
// plain C++ with the C library: the supervisor links nothing else.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include <unordered_map>
#include <vector>

namespace taskgrid::agent::proc {

struct Stat {
  pid_t ppid = 0;
  char state = '?';
  uint64_t start_ticks = 0;  // field 22: when it started, in clock ticks since boot
};

// /proc/PID/stat of `pid`; false when it is gone.
inline bool ReadStat(pid_t pid, Stat* st) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[1024];
  const ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  // The name may hold spaces and parentheses: the fields start after the
  // last ')'.
  const char* close_paren = strrchr(buf, ')');
  if (close_paren == nullptr) return false;
  int parent = 0;
  unsigned long long start = 0;
  // state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt
  // utime stime cutime cstime priority nice num_threads itrealvalue starttime
  if (sscanf(close_paren + 1,
             " %c %d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
             &st->state, &parent, &start) != 3) {
    return false;
  }
  st->ppid = parent;
  st->start_ticks = start;
  return true;
}

// Every process's parent: pid -> its children, and each one's state.
struct Tree {
  std::unordered_map<pid_t, std::vector<pid_t>> children;
  std::unordered_map<pid_t, char> states;
};

inline Tree ReadTree() {
  Tree tree;
  DIR* dir = opendir("/proc");
  if (dir == nullptr) return tree;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long pid = strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || pid <= 0) continue;
    Stat st;
    if (!ReadStat(static_cast<pid_t>(pid), &st)) continue;
    tree.children[st.ppid].push_back(static_cast<pid_t>(pid));
    tree.states[static_cast<pid_t>(pid)] = st.state;
  }
  closedir(dir);
  return tree;
}

// Every process below `root` in `tree` (zombies too when `with_zombies`).
inline std::vector<pid_t> Below(const Tree& tree, pid_t root, bool with_zombies = false) {
  std::vector<pid_t> found;
  std::vector<pid_t> todo = {root};
  while (!todo.empty()) {
    const pid_t p = todo.back();
    todo.pop_back();
    auto it = tree.children.find(p);
    if (it == tree.children.end()) continue;
    for (pid_t c : it->second) {
      auto s = tree.states.find(c);
      if (with_zombies || s == tree.states.end() || s->second != 'Z') found.push_back(c);
      todo.push_back(c);
    }
  }
  return found;
}

// Every live process below `root`.
inline std::vector<pid_t> LiveDescendants(pid_t root) { return Below(ReadTree(), root); }

// Kills `root` (when it still is the process that started at
// `start_ticks`) and everything below it, none of whom is our child: each
// round stops every process of the tree first (so that none forks or
// moves away meanwhile), then kills them all, until nothing of it is left
// or `rounds` ran. Returns whether `root` was there to kill.
inline bool KillTree(pid_t root, uint64_t start_ticks, int rounds = 50) {
  Stat st;
  if (root <= 1 || !ReadStat(root, &st) || st.start_ticks != start_ticks) return false;
  for (int round = 0; round < rounds; ++round) {
    std::vector<pid_t> all = LiveDescendants(root);
    Stat now;
    const bool root_alive = ReadStat(root, &now) && now.start_ticks == start_ticks &&
                            now.state != 'Z' && now.state != 'X';
    if (root_alive) all.push_back(root);
    if (all.empty()) break;
    for (pid_t p : all) kill(p, SIGSTOP);
    // What was forked before the stop landed is below them now too.
    std::vector<pid_t> more = LiveDescendants(root);
    all.insert(all.end(), more.begin(), more.end());
    for (pid_t p : all) kill(p, SIGKILL);
    usleep(2000);
  }
  return true;
}

}  // namespace taskgrid::agent::proc
