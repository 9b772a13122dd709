// A small portable random number generator for everything the engine draws: parameter init,
// synthetic data and generation prompts. The standard library's distributions are
// implementation-defined (std::normal_distribution differs between libstdc++ and libc++), so a
// seed would not mean the same model or data everywhere; these are fully specified:
//   - SplitMix64 (Steele, Lea, Flood 2014) to mix seeds and hash (seed, rank, step, ...) tuples;
//   - xoshiro256** (Blackman, Vigna 2018) as the stream;
//   - uniform doubles from the top 53 bits, unbiased bounded integers by rejection,
//     Gaussians by the Box-Muller transform (both values of each pair are used).
//
// Thread-safety: an Rng is a value; use one per thread.
#ifndef BOULDER_WORKER_ENGINE_RNG_H_
#define BOULDER_WORKER_ENGINE_RNG_H_

#include <cmath>
#include <cstdint>
#include <initializer_list>

namespace boulder::engine {

// One SplitMix64 step: advances *state and returns the next output.
inline uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Hashes a sequence of 64-bit words into one (order matters): used to derive independent
// streams from (seed, rank, step, micro-batch) tuples.
inline uint64_t HashWords(std::initializer_list<uint64_t> words) {
  uint64_t state = 0x6A09E667F3BCC908ull;
  uint64_t h = SplitMix64(&state);
  for (uint64_t w : words) {
    state ^= w + h;
    h = SplitMix64(&state);
  }
  return h;
}

class Rng {
 public:
  explicit Rng(uint64_t seed) {
    uint64_t sm = seed;
    for (uint64_t& w : s_) w = SplitMix64(&sm);
  }

  // xoshiro256**.
  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1).
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

  // Uniform integer in [0, n). REQUIRES: n > 0.
  uint64_t Below(uint64_t n) {
    // Reject the top partial copy of [0, n) so every value is equally likely.
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do {
      x = Next();
    } while (x >= limit);
    return x % n;
  }

  // Standard normal (Box-Muller; caches the second value of each pair).
  double Gaussian() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    // 1 - Uniform() is in (0, 1], so the log is finite.
    const double u1 = 1.0 - Uniform();
    const double u2 = Uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double theta = 2.0 * M_PI * u2;
    spare_ = r * std::sin(theta);
    has_spare_ = true;
    return r * std::cos(theta);
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

  uint64_t s_[4];
  double spare_ = 0.0;
  bool has_spare_ = false;
};

}  // namespace boulder::engine

#endif  // BOULDER_WORKER_ENGINE_RNG_H_
