// Helpers for the CPU backend's tests: seeded random data, backend-owned buffers, NaN
// poisoning, central finite differences and tolerance checks.
#ifndef BOULDER_KERNELS_CPU_TEST_UTIL_H_
#define BOULDER_KERNELS_CPU_TEST_UTIL_H_

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"

namespace boulder::kernels::cpu::testutil {

// Uniform values in [lo, hi) from a fixed seed.
inline std::vector<double> RandomVector(size_t n, uint64_t seed, double lo = -1.0,
                                        double hi = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = dist(rng);
  return v;
}

// A typed buffer allocated through a backend (host memory on the cpu backend, so the test
// reads and writes it directly), freed on destruction.
template <typename S>
class Buf {
 public:
  Buf(Backend* backend, size_t n) : backend_(backend), n_(n) {
    auto ptr = backend->Alloc(n * sizeof(S));
    EXPECT_TRUE(ptr.ok()) << ptr.status();
    ptr_ = ptr.ok() ? static_cast<S*>(*ptr) : nullptr;
  }
  // Allocated and filled from `values` (converted to S).
  Buf(Backend* backend, const std::vector<double>& values) : Buf(backend, values.size()) {
    Set(values);
  }
  ~Buf() { backend_->Free(ptr_); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;

  S* get() { return ptr_; }
  const S* get() const { return ptr_; }
  S& operator[](size_t i) { return ptr_[i]; }
  const S& operator[](size_t i) const { return ptr_[i]; }
  size_t size() const { return n_; }

  // Sets the first values.size() elements.
  void Set(const std::vector<double>& values) {
    ASSERT_LE(values.size(), n_);
    for (size_t i = 0; i < values.size(); ++i) ptr_[i] = static_cast<S>(values[i]);
  }
  // Fills with NaN so that any element an op fails to write shows up.
  void Poison() {
    for (size_t i = 0; i < n_; ++i) ptr_[i] = std::numeric_limits<S>::quiet_NaN();
  }
  std::vector<double> ToVector() const { return std::vector<double>(ptr_, ptr_ + n_); }

 private:
  Backend* backend_;
  size_t n_;
  S* ptr_;
};

// floor_frac for comparing FP32 results against FP64: elements far below the largest come
// from cancellation of larger terms and carry their absolute rounding error.
inline constexpr double kScaleFloor = 0.1;

// Σ r_i * x_i: the random linear functional used as the loss of an op's outputs.
template <typename S>
double Dot(const std::vector<double>& r, const S* x) {
  double sum = 0;
  for (size_t i = 0; i < r.size(); ++i) sum += r[i] * static_cast<double>(x[i]);
  return sum;
}

// Central differences d loss / d x_i for every element of x (perturbed in place, then
// restored exactly).
inline std::vector<double> NumericGrad(double* x, size_t n, const std::function<double()>& loss,
                                       double h = 1e-5) {
  std::vector<double> grad(n);
  for (size_t i = 0; i < n; ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double plus = loss();
    x[i] = saved - h;
    const double minus = loss();
    x[i] = saved;
    grad[i] = (plus - minus) / (2 * h);
  }
  return grad;
}

// Expects got[i] ≈ want[i] for all i: |got - want| <= rtol * max(|want|, floor), where the
// floor (floor_frac of the largest |want|) keeps elements near zero from demanding an
// impossible relative accuracy. NaN in got fails.
template <typename S>
void ExpectAllClose(const std::vector<double>& want, const S* got, double rtol,
                    const std::string& what, double floor_frac = 1e-3) {
  double max_abs = 0;
  for (double w : want) max_abs = std::max(max_abs, std::fabs(w));
  const double floor = std::max(max_abs * floor_frac, 1e-300);
  int failures = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = static_cast<double>(got[i]);
    const double tol = rtol * std::max(std::fabs(want[i]), floor);
    if (!(std::fabs(g - want[i]) <= tol) && ++failures <= 5) {
      ADD_FAILURE() << what << "[" << i << "]: got " << g << ", want " << want[i] << " (tolerance "
                    << tol << ")";
    }
  }
  EXPECT_EQ(failures, 0) << what << ": " << failures << " of " << want.size()
                         << " elements out of tolerance";
}

template <typename S>
void ExpectAllClose(const std::vector<double>& want, const std::vector<S>& got, double rtol,
                    const std::string& what, double floor_frac = 1e-3) {
  ASSERT_EQ(want.size(), got.size()) << what;
  ExpectAllClose(want, got.data(), rtol, what, floor_frac);
}

// For a gradient that accumulates (+=): expects got - initial ≈ calls * want, i.e. that
// `calls` backward calls each added `want` to a buffer that started at `initial`. The
// increment is compared, so the tolerance is relative to the gradient, not to the sum.
template <typename S>
void ExpectAccumulated(const std::vector<double>& initial, const S* got, int calls,
                       const std::vector<double>& want, double rtol, const std::string& what) {
  std::vector<double> increment(want.size()), scaled(want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    increment[i] = static_cast<double>(got[i]) - initial[i];
    scaled[i] = calls * want[i];
  }
  ExpectAllClose(scaled, increment, rtol, what);
}

}  // namespace boulder::kernels::cpu::testutil

#endif  // BOULDER_KERNELS_CPU_TEST_UTIL_H_
