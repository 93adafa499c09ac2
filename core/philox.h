// Counter-based random numbers (Philox-4x32-10, Salmon et al. 2011) addressed by purpose, not by
// order of calls. A stream is keyed by (seed, purpose string) and a draw is addressed by two 64-bit
// counters (for example: global element index and step). So the same config reproduces bit for bit and
// every parallel layout draws the same number for the same element. Not for cryptography.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <string_view>

#include "core/host_device.h"

namespace moe {

using Philox4x32Counter = std::array<uint32_t, 4>;
using Philox4x32Key = std::array<uint32_t, 2>;

// The arithmetic below also compiles as CUDA device code (core/host_device.h): the CUDA backend's Gumbel noise
// draws the same numbers as the CPU's.

// The bare Philox-4x32 with 10 rounds, in place on c[4] with the key (k0, k1).
MOE_HOST_DEVICE inline void philox4x32_10_inplace(uint32_t* c, uint32_t k0, uint32_t k1) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;
  constexpr uint32_t W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(M0) * c[0];
    const uint64_t p1 = uint64_t(M1) * c[2];
    const uint32_t n0 = uint32_t(p1 >> 32) ^ c[1] ^ k0, n2 = uint32_t(p0 >> 32) ^ c[3] ^ k1;
    c[0] = n0, c[1] = uint32_t(p1), c[2] = n2, c[3] = uint32_t(p0);
    k0 += W0;
    k1 += W1;
  }
}

// Uniform in the open interval (0, 1) from the first two words of a Philox block, 53 bits.
MOE_HOST_DEVICE inline double philox_uniform53(const uint32_t* r) {
  const uint64_t x = ((uint64_t(r[0]) << 32) | r[1]) >> 11;
  return (double(x) + 0.5) * (1.0 / 9007199254740992.0);
}

// The Philox block of stream `key` at counters (a, b) (RngStream::bits), into r[4].
MOE_HOST_DEVICE inline void philox_block(uint64_t key, uint64_t a, uint64_t b, uint32_t* r) {
  r[0] = uint32_t(a), r[1] = uint32_t(a >> 32), r[2] = uint32_t(b), r[3] = uint32_t(b >> 32);
  philox4x32_10_inplace(r, uint32_t(key), uint32_t(key >> 32));
}

inline Philox4x32Counter philox4x32_10(Philox4x32Counter ctr, Philox4x32Key key) {
  philox4x32_10_inplace(ctr.data(), key[0], key[1]);
  return ctr;
}

// FNV-1a 64 of a purpose string, mixed with the seed (splitmix64 finaliser).
inline uint64_t rng_stream_key(uint64_t seed, std::string_view purpose) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : purpose) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  uint64_t z = h ^ (seed + 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// One stream: draws are pure functions of (key, a, b).
struct RngStream {
  uint64_t key = 0;

  RngStream() = default;
  RngStream(uint64_t seed, std::string_view purpose) : key(rng_stream_key(seed, purpose)) {}

  Philox4x32Counter bits(uint64_t a, uint64_t b) const {
    return philox4x32_10({uint32_t(a), uint32_t(a >> 32), uint32_t(b), uint32_t(b >> 32)},
                         {uint32_t(key), uint32_t(key >> 32)});
  }
  // Uniform in the open interval (0, 1), 53 bits.
  double uniform(uint64_t a, uint64_t b = 0) const {
    const Philox4x32Counter r = bits(a, b);
    return philox_uniform53(r.data());
  }
  // Standard normal by Box-Muller from one Philox block.
  double normal(uint64_t a, uint64_t b = 0) const {
    const Philox4x32Counter r = bits(a, b);
    const double u1 = (double(((uint64_t(r[0]) << 32) | r[1]) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    const double u2 = (double(r[2]) + 0.5) * (1.0 / 4294967296.0);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }
  // Standard Gumbel: -log(-log(u)).
  double gumbel(uint64_t a, uint64_t b = 0) const { return -std::log(-std::log(uniform(a, b))); }
  // Uniform integer in [0, n).
  uint64_t below(uint64_t n, uint64_t a, uint64_t b = 0) const {
    const Philox4x32Counter r = bits(a, b);
    const unsigned __int128 x = (unsigned __int128)((uint64_t(r[0]) << 32) | r[1]) * n;
    return uint64_t(x >> 64);
  }
};

}  // namespace moe
