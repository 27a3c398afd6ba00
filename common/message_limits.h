// The sizes of gRPC messages between Taskgrid's processes.
#pragma once

namespace taskgrid {

// The largest message the scheduler accepts (--max_message_bytes), and the
// largest an agent accepts from it.
inline constexpr int kMaxRequestBytes = 64 << 20;

// What every client accepts in a reply. A reply can be a little larger
// than the request it answers (SubmitTasks returns each task it stored,
// spec and all, plus its state and times), so the scheduler may send up to
// its request limit plus kReplyHeadroomBytes.
inline constexpr int kReplyHeadroomBytes = 16 << 20;
inline constexpr int kMaxReplyBytes = kMaxRequestBytes + kReplyHeadroomBytes;

// Live output (TaskOutput, StreamTaskOutputResponse): the most data one
// message carries. An agent sends no more; the scheduler cuts what a
// message holds past it.
inline constexpr int kMaxOutputChunkBytes = 64 << 10;

}  // namespace taskgrid
