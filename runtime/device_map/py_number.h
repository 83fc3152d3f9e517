// PyNum: a number with Python's int/float semantics, so that sizes and budgets compare exactly as
// they do in accelerate. Sizes are Python ints until a fractional element size (bool 1/8, int4
// 1/2) or a float budget makes them floats; int + float is a float, int vs float comparisons
// are exact, `//` and int() follow CPython.
#ifndef LOADSTONE_RUNTIME_DEVICE_MAP_PY_NUMBER_H_
#define LOADSTONE_RUNTIME_DEVICE_MAP_PY_NUMBER_H_

#include <cstdint>
#include <string>

namespace loadstone::device_map {

class PyNum {
 public:
  constexpr PyNum() = default;  // int 0
  static constexpr PyNum Int(int64_t v) { return PyNum(false, v, 0.0); }
  static constexpr PyNum Float(double v) { return PyNum(true, 0, v); }

  bool is_float() const { return is_float_; }
  double AsDouble() const { return is_float_ ? f_ : static_cast<double>(i_); }

  PyNum& operator+=(PyNum other);
  PyNum& operator-=(PyNum other);
  friend PyNum operator+(PyNum a, PyNum b) { return a += b; }
  friend PyNum operator-(PyNum a, PyNum b) { return a -= b; }
  friend PyNum operator*(PyNum a, PyNum b);

  // Exact comparisons (false for NaN, as in Python).
  friend bool operator<(PyNum a, PyNum b) { return Compare(a, b) < 0; }
  friend bool operator>(PyNum a, PyNum b) { return Compare(b, a) < 0; }
  friend bool operator<=(PyNum a, PyNum b) { int c = Compare(a, b); return c == -1 || c == 0; }
  friend bool operator>=(PyNum a, PyNum b) { int c = Compare(b, a); return c == -1 || c == 0; }
  friend bool operator==(PyNum a, PyNum b) { return Compare(a, b) == 0; }

  // Python's `a // n` for n > 0.
  PyNum FloorDiv(int64_t n) const;
  // Python's int(x): truncation toward zero (saturating; NaN gives 0).
  int64_t Trunc() const;
  // Whole bytes, rounded up; negative values give 0.
  uint64_t CeilBytes() const;
  // Python's repr: "120", "120.0", "0.5", "1e+16".
  std::string Repr() const;

 private:
  constexpr PyNum(bool is_float, int64_t i, double f) : is_float_(is_float), i_(i), f_(f) {}
  // -1, 0, 1, or 2 when unordered (NaN).
  static int Compare(PyNum a, PyNum b);

  bool is_float_ = false;
  int64_t i_ = 0;
  double f_ = 0.0;
};

// Python's min(a, b) and max(a, b): the first argument unless the second is strictly smaller
// (larger), so the int/float kind of ties follows Python.
inline PyNum PyMin(PyNum a, PyNum b) { return b < a ? b : a; }
inline PyNum PyMax(PyNum a, PyNum b) { return b > a ? b : a; }

}  // namespace loadstone::device_map

#endif  // LOADSTONE_RUNTIME_DEVICE_MAP_PY_NUMBER_H_
