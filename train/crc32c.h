// train/crc32c.h: CRC-32C (Castagnoli, iSCSI; RFC 3720), the checksum of Zarr v3's crc32c codec.
#pragma once

#include <cstddef>
#include <cstdint>

namespace meshrt::detail {

// The CRC-32C of `n` bytes at `data`, continuing from `crc` (the value returned for the bytes
// before them; 0 to start): crc32c("123456789") == 0xE3069283. Uses the SSE 4.2 instruction where
// the CPU has it, else slicing-by-8 tables. Thread-safe.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

// The table-driven form alone and the hardware form alone (tests compare both with the known
// vectors); crc32c_hw is crc32c_sw on a CPU without SSE 4.2.
uint32_t crc32c_sw(const void* data, size_t n, uint32_t crc = 0);
uint32_t crc32c_hw(const void* data, size_t n, uint32_t crc = 0);

}  // namespace meshrt::detail
