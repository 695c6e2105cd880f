// collectives/transport.h: the primitives a collective algorithm may use between the members of
// one group, and nothing else, so one algorithm serves every backend.
//
//   copy    bytes from a member's buffer to another member's buffer
//   reduce  dst = src op dst, elementwise, on a member's buffer
//   signal  publish "I have completed unit u" (a monotone progress counter per member)
//   wait    until a member's counter reaches u
//
// Buffers are named per member: its input, its work buffer (where ring algorithms accumulate;
// often the output itself). cpu implements the primitives with shared memory and atomics; a
// GPU backend maps them to peer copies, reduction kernels and events.
#pragma once

#include <cstdint>

#include "collectives/fingerprint.h"

namespace meshrt::coll {

enum class Buf { in, work };

class Transport {
 public:
  virtual ~Transport() = default;
  virtual void copy(int64_t dst, Buf dst_buf, int64_t dst_off, int64_t src, Buf src_buf,
                    int64_t src_off, int64_t bytes) = 0;
  // Elements [dst_off, +count) of dst's buffer become src op dst (offsets in elements of dtype).
  virtual void reduce(Kind op, DType dtype, int64_t dst, Buf dst_buf, int64_t dst_off, int64_t src,
                      Buf src_buf, int64_t src_off, int64_t count) = 0;
  virtual void signal(int64_t me, uint32_t unit) = 0;
  virtual void wait(int64_t member, uint32_t unit) = 0;
};

}  // namespace meshrt::coll
