// LiveOutput: the newest bytes of one attempt's stdout and stderr, kept
// while it runs so that someone following the task (StreamTaskOutput) can
// be sent what it writes. Each stream is a ring of `cap` bytes (allocated
// on the stream's first byte) and the count of every byte written, which
// is the offset of the next one: a reader that asks for bytes the ring no
// longer holds gets the oldest it does hold, and the offset says what went.
//
// Thread-safe: the attempt's thread appends (through OutputTail, as its
// steps write), the agent core reads from its timer and stream threads.
// Kept alive by shared_ptr by the TaskRun and, while watched, the core.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

namespace taskgrid::agent {

class LiveOutput {
 public:
  enum Stream { kStdout = 0, kStderr = 1 };
  static constexpr int kStreams = 2;

  explicit LiveOutput(size_t cap) : cap_(cap) {}

  void Append(Stream stream, const char* data, size_t n);

  struct Piece {
    int64_t offset = 0;  // of data's first byte in the stream
    std::string data;
  };
  // Up to `max` bytes of `stream` from offset `from` on, or from the
  // oldest byte held when `from` is older (or negative); empty data at
  // end() when there is nothing newer.
  Piece Read(Stream stream, int64_t from, size_t max) const;
  // Bytes written to `stream` so far.
  int64_t end(Stream stream) const;

 private:
  struct Ring {
    std::string buf;  // cap_ bytes once the first byte came; byte at offset o is buf[o % cap_]
    int64_t end = 0;
  };
  const size_t cap_;
  mutable std::mutex mu_;
  Ring rings_[kStreams];  // guarded by mu_
};

}  // namespace taskgrid::agent
