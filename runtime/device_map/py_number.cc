#include "runtime/device_map/py_number.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <string_view>

namespace loadstone::device_map {
namespace {

constexpr double kTwo63 = 9223372036854775808.0;

// -1, 0, 1 for i <, ==, > d exactly; 2 when d is NaN.
int CompareIntDouble(int64_t i, double d) {
  if (std::isnan(d)) return 2;
  if (d >= kTwo63) return -1;
  if (d < -kTwo63) return 1;
  double floor_d = std::floor(d);
  auto floor_i = static_cast<int64_t>(floor_d);
  if (i < floor_i) return -1;
  if (i > floor_i) return 1;
  return d > floor_d ? -1 : 0;
}

}  // namespace

int PyNum::Compare(PyNum a, PyNum b) {
  if (!a.is_float_ && !b.is_float_) return a.i_ < b.i_ ? -1 : (a.i_ > b.i_ ? 1 : 0);
  if (a.is_float_ && b.is_float_) {
    if (std::isnan(a.f_) || std::isnan(b.f_)) return 2;
    return a.f_ < b.f_ ? -1 : (a.f_ > b.f_ ? 1 : 0);
  }
  if (!a.is_float_) return CompareIntDouble(a.i_, b.f_);
  int c = CompareIntDouble(b.i_, a.f_);
  return c == 2 ? 2 : -c;
}

PyNum& PyNum::operator+=(PyNum other) {
  if (!is_float_ && !other.is_float_) {
    int64_t sum;
    if (!__builtin_add_overflow(i_, other.i_, &sum)) {
      i_ = sum;
      return *this;
    }
  }
  *this = Float(AsDouble() + other.AsDouble());
  return *this;
}

PyNum& PyNum::operator-=(PyNum other) {
  if (!is_float_ && !other.is_float_) {
    int64_t diff;
    if (!__builtin_sub_overflow(i_, other.i_, &diff)) {
      i_ = diff;
      return *this;
    }
  }
  *this = Float(AsDouble() - other.AsDouble());
  return *this;
}

PyNum operator*(PyNum a, PyNum b) {
  if (!a.is_float_ && !b.is_float_) {
    int64_t product;
    if (!__builtin_mul_overflow(a.i_, b.i_, &product)) return PyNum::Int(product);
  }
  return PyNum::Float(a.AsDouble() * b.AsDouble());
}

PyNum PyNum::FloorDiv(int64_t n) const {
  if (!is_float_) {
    int64_t q = i_ / n;
    if (i_ % n != 0 && ((i_ < 0) != (n < 0))) --q;
    return Int(q);
  }
  // CPython's float floor division (_float_div_mod).
  double vx = f_;
  auto wx = static_cast<double>(n);
  double mod = std::fmod(vx, wx);
  double div = (vx - mod) / wx;
  if (mod != 0.0) {
    if ((wx < 0) != (mod < 0)) div -= 1.0;
  }
  double floordiv;
  if (div != 0.0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, vx / wx);
  }
  return Float(floordiv);
}

int64_t PyNum::Trunc() const {
  if (!is_float_) return i_;
  if (std::isnan(f_)) return 0;
  if (f_ >= kTwo63) return std::numeric_limits<int64_t>::max();
  if (f_ <= -kTwo63) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(std::trunc(f_));
}

uint64_t PyNum::CeilBytes() const {
  if (!is_float_) return i_ < 0 ? 0 : static_cast<uint64_t>(i_);
  if (!(f_ > 0)) return 0;
  if (f_ >= 18446744073709551616.0) return std::numeric_limits<uint64_t>::max();
  return static_cast<uint64_t>(std::ceil(f_));
}

std::string PyNum::Repr() const {
  if (!is_float_) return std::to_string(i_);
  if (std::isnan(f_)) return "nan";
  if (std::isinf(f_)) return f_ > 0 ? "inf" : "-inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), f_, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(end - buf));
  size_t e_pos = sci.find('e');
  int exponent = 0;
  std::from_chars(sci.data() + e_pos + (sci[e_pos + 1] == '+' ? 2 : 1), sci.data() + sci.size(),
                  exponent);
  if (exponent < -4 || exponent >= 16) return std::string(sci);
  std::string out;
  std::string_view mantissa = sci.substr(0, e_pos);
  if (mantissa.front() == '-') {
    out += '-';
    mantissa.remove_prefix(1);
  }
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits += c;
  }
  if (exponent < 0) {
    out += "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    return out;
  }
  auto int_len = static_cast<size_t>(exponent) + 1;
  if (digits.size() <= int_len) {
    out += digits + std::string(int_len - digits.size(), '0') + ".0";
  } else {
    out += digits.substr(0, int_len) + "." + digits.substr(int_len);
  }
  return out;
}

}  // namespace loadstone::device_map
