// packing.py's LSB-first bit streams: pack_bits and unpack_bits.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels.h"
#include "packing.h"

namespace onnxq {

// Codes [i0, i1) (i0 a multiple of 8: the stream is byte aligned there) into the stream.
void kern::pack_range(const void* codes, int width, int64_t i0, int64_t i1, int bits, uint8_t* out) {
  if (i1 <= i0) return;  // an empty range may come with null buffers: no pointer arithmetic on them
  uint8_t* o = out + (i0 * bits) / 8;
  if (width == 1 && bits == 8) {
    std::memcpy(o, static_cast<const uint8_t*>(codes) + i0, static_cast<size_t>(i1 - i0));
    return;
  }
  if (width == 1 && bits == 4) {
    const uint8_t* c = static_cast<const uint8_t*>(codes) + i0;
    int64_t n = i1 - i0, k = 0;
    for (; k + 1 < n; k += 2) o[k >> 1] = static_cast<uint8_t>((c[k] & 0xF) | ((c[k + 1] & 0xF) << 4));
    if (k < n) o[k >> 1] = static_cast<uint8_t>(c[k] & 0xF);
    return;
  }
  if (width == 1 && (bits == 1 || bits == 2)) {
    const uint8_t* c = static_cast<const uint8_t*>(codes) + i0;
    int per = 8 / bits;
    uint32_t cm = (1u << bits) - 1u;
    int64_t n = i1 - i0, k = 0;
    for (; k + per <= n; k += per) {
      uint32_t v = 0;
      for (int j = 0; j < per; ++j) v |= (c[k + j] & cm) << (j * bits);
      o[k / per] = static_cast<uint8_t>(v);
    }
    if (k < n) {
      uint32_t v = 0;
      for (int j = 0; k + j < n; ++j) v |= (c[k + j] & cm) << (j * bits);
      o[k / per] = static_cast<uint8_t>(v);
    }
    return;
  }
  uint64_t m = bits >= 64 ? ~0ull : (1ull << bits) - 1;
  uint64_t acc = 0;  // pending bits, LSB first
  int nacc = 0;
  for (int64_t i = i0; i < i1; ++i) {
    uint64_t v = load_code(codes, width, i) & m;
    int take = bits;
    while (take > 0) {
      int room = 64 - nacc;
      int t = take < room ? take : room;
      uint64_t part = t >= 64 ? v : v & ((1ull << t) - 1);
      acc |= nacc < 64 ? part << nacc : 0;
      nacc += t;
      v = t >= 64 ? 0 : v >> t;
      take -= t;
      while (nacc >= 8) {
        *o++ = static_cast<uint8_t>(acc);
        acc >>= 8;
        nacc -= 8;
      }
    }
  }
  if (nacc > 0) *o = static_cast<uint8_t>(acc);
}

namespace {

// Codes [i0, i1) (i0 a multiple of 8) from the stream.
void unpack_range(const uint8_t* stream, int bits, int64_t i0, int64_t i1, void* codes,
                  int width) {
  if (i1 <= i0) return;  // as in pack_range
  const uint8_t* s = stream + (i0 * bits) / 8;
  if (width == 1 && bits == 8) {
    std::memcpy(static_cast<uint8_t*>(codes) + i0, s, static_cast<size_t>(i1 - i0));
    return;
  }
  if (width == 1 && (bits == 4 || bits == 1 || bits == 2)) {
    uint8_t* c = static_cast<uint8_t*>(codes) + i0;
    int per = 8 / bits;
    uint8_t m = static_cast<uint8_t>((1u << bits) - 1);
    for (int64_t k = 0; k < i1 - i0; ++k)
      c[k] = static_cast<uint8_t>((s[k / per] >> ((k % per) * bits)) & m);
    return;
  }
  uint64_t acc = 0;
  int nacc = 0;
  for (int64_t i = i0; i < i1; ++i) {
    uint64_t v = 0;
    int done = 0;
    while (done < bits) {
      if (nacc == 0) {
        acc = *s++;
        nacc = 8;
      }
      int t = bits - done < nacc ? bits - done : nacc;
      v |= (acc & ((1ull << t) - 1)) << done;
      acc >>= t;
      nacc -= t;
      done += t;
    }
    store_code(codes, width, i, v);
  }
}

constexpr int64_t kPackChunk = int64_t(1) << 16;  // codes per parallel chunk (a multiple of 8)

}  // namespace

using kern::pack_range;

int64_t pack_bits(const void* codes, int width, int64_t count, int bits, const uint8_t* mask,
                  uint8_t* out, const ParallelFor* pf) {
  if (mask) {
    // The stream holds the kept codes only (out is sized for them): clear just those bytes.
    int64_t kept = 0;
    for (int64_t i = 0; i < count; ++i) kept += mask[i] ? 1 : 0;
    std::memset(out, 0, static_cast<size_t>(packed_nbytes(kept, bits)));
    int64_t k = 0;
    uint64_t bitpos = 0;
    for (int64_t i = 0; i < count; ++i) {
      if (!mask[i]) continue;
      uint64_t v = load_code(codes, width, i);
      for (int done = 0; done < bits;) {
        uint64_t byte = bitpos >> 3;
        int off = static_cast<int>(bitpos & 7);
        int take = std::min(8 - off, bits - done);
        out[byte] |= static_cast<uint8_t>(((v >> done) & ((1u << take) - 1)) << off);
        done += take;
        bitpos += static_cast<uint64_t>(take);
      }
      k++;
    }
    return k;
  }
  int64_t chunks = (count + kPackChunk - 1) / kPackChunk;
  auto body = [&](int64_t c0, int64_t c1) {
    pack_range(codes, width, c0 * kPackChunk, std::min(count, c1 * kPackChunk), bits, out);
  };
  if (pf && chunks > 1) {
    (*pf)(chunks, body);
  } else {
    body(0, chunks);
  }
  return count;
}

void unpack_bits(const uint8_t* stream, int bits, int64_t count, const uint8_t* mask,
                 void* codes, int width, const ParallelFor* pf) {
  if (mask) {
    uint64_t bitpos = 0;
    for (int64_t i = 0; i < count; ++i) {
      if (!mask[i]) {
        store_code(codes, width, i, 0);
        continue;
      }
      uint64_t v = 0;
      for (int done = 0; done < bits;) {
        uint64_t byte = bitpos >> 3;
        int off = static_cast<int>(bitpos & 7);
        int take = std::min(8 - off, bits - done);
        v |= static_cast<uint64_t>((stream[byte] >> off) & ((1u << take) - 1)) << done;
        done += take;
        bitpos += static_cast<uint64_t>(take);
      }
      store_code(codes, width, i, v);
    }
    return;
  }
  int64_t chunks = (count + kPackChunk - 1) / kPackChunk;
  auto body = [&](int64_t c0, int64_t c1) {
    unpack_range(stream, bits, c0 * kPackChunk, std::min(count, c1 * kPackChunk), codes, width);
  };
  if (pf && chunks > 1) {
    (*pf)(chunks, body);
  } else {
    body(0, chunks);
  }
}

}  // namespace onnxq
