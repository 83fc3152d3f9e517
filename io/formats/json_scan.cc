#include "io/formats/json_scan.h"

#include <array>
#include <charconv>
#include <cmath>
#include <system_error>

#include "io/formats/utf8.h"

namespace loadstone::io::json_scan {
namespace {

// How a byte inside a string is read: copied as it is, or not.
enum : uint8_t { kPlain = 0, kQuote, kBackslash, kControl, kHigh };

constexpr std::array<uint8_t, 256> MakeStringClasses() {
  std::array<uint8_t, 256> classes{};
  for (int c = 0; c < 0x20; ++c) classes[c] = kControl;
  for (int c = 0x80; c < 0x100; ++c) classes[c] = kHigh;
  classes['"'] = kQuote;
  classes['\\'] = kBackslash;
  return classes;
}
constexpr std::array<uint8_t, 256> kStringClass = MakeStringClasses();

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace

Token Lexer::Next() {
  while (p_ < end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  if (p_ == end_) return Token::kEnd;
  switch (*p_) {
    case '{': ++p_; return Token::kBeginObject;
    case '}': ++p_; return Token::kEndObject;
    case '[': ++p_; return Token::kBeginArray;
    case ']': ++p_; return Token::kEndArray;
    case ':': ++p_; return Token::kColon;
    case ',': ++p_; return Token::kComma;
    case '"': ++p_; return String();
    case 't': return Word("true", Token::kTrue);
    case 'f': return Word("false", Token::kFalse);
    case 'n': return Word("null", Token::kNull);
    default: return *p_ == '-' || IsDigit(*p_) ? Number() : Token::kUnsure;
  }
}

Token Lexer::Word(std::string_view word, Token token) {
  if (static_cast<size_t>(end_ - p_) < word.size() || std::string_view(p_, word.size()) != word) {
    return Token::kUnsure;
  }
  p_ += word.size();
  return token;
}

// After the opening quote. Runs of plain bytes are appended whole; bytes of 0x80 and above are
// kept and the string checked as UTF-8 once at its end (the ranges nlohmann's lexer accepts).
Token Lexer::String() {
  text_.clear();
  bool high = false;
  while (true) {
    const char* run = p_;
    while (p_ < end_ && kStringClass[static_cast<uint8_t>(*p_)] == kPlain) ++p_;
    text_.append(run, p_);
    if (p_ == end_) return Token::kUnsure;
    switch (kStringClass[static_cast<uint8_t>(*p_)]) {
      case kQuote:
        ++p_;
        if (high && FindInvalidUtf8(text_) != std::string_view::npos) return Token::kUnsure;
        return Token::kString;
      case kBackslash:
        ++p_;
        if (!Escape()) return Token::kUnsure;
        break;
      case kHigh:
        high = true;
        text_.push_back(*p_++);
        break;
      default: return Token::kUnsure;  // a control character
    }
  }
}

// After a backslash: one escape appended to text_; false for one this reader leaves to nlohmann.
bool Lexer::Escape() {
  if (p_ == end_) return false;
  const char c = *p_++;
  switch (c) {
    case '"': case '\\': case '/': text_.push_back(c); return true;
    case 'b': text_.push_back('\b'); return true;
    case 'f': text_.push_back('\f'); return true;
    case 'n': text_.push_back('\n'); return true;
    case 'r': text_.push_back('\r'); return true;
    case 't': text_.push_back('\t'); return true;
    case 'u': break;
    default: return false;
  }
  const auto hex4 = [this]() -> int {
    if (end_ - p_ < 4) return -1;
    int v = 0;
    for (int i = 0; i < 4; ++i) {
      const int h = HexValue(p_[i]);
      if (h < 0) return -1;
      v = v * 16 + h;
    }
    p_ += 4;
    return v;
  };
  const int first = hex4();
  if (first <= 0 || (first >= 0xDC00 && first <= 0xDFFF)) return false;
  uint32_t cp = static_cast<uint32_t>(first);
  if (first >= 0xD800 && first <= 0xDBFF) {  // a high surrogate: its low one must follow
    if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u') return false;
    p_ += 2;
    const int second = hex4();
    if (second < 0xDC00 || second > 0xDFFF) return false;
    cp = 0x10000 + ((cp - 0xD800) << 10) + static_cast<uint32_t>(second - 0xDC00);
  }
  AppendUtf8(cp, &text_);
  return true;
}

// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?, ending at the first other byte, as nlohmann's
// scan_number ends. Integers that fit are kUnsigned (no sign) or kInteger (a sign, -0 included);
// others (a fraction, an exponent) kFloat; integers beyond 64 bits, and doubles beyond range, kUnsure.
Token Lexer::Number() {
  const char* start = p_;
  const bool negative = *p_ == '-';
  if (negative) ++p_;
  if (p_ == end_ || !IsDigit(*p_)) return Token::kUnsure;
  if (*p_ == '0') {
    ++p_;
  } else {
    while (p_ < end_ && IsDigit(*p_)) ++p_;
  }
  const char* integer_end = p_;
  bool is_float = false;
  if (p_ < end_ && *p_ == '.') {
    ++p_;
    if (p_ == end_ || !IsDigit(*p_)) return Token::kUnsure;
    while (p_ < end_ && IsDigit(*p_)) ++p_;
    is_float = true;
  }
  if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
    ++p_;
    if (p_ < end_ && (*p_ == '+' || *p_ == '-')) ++p_;
    if (p_ == end_ || !IsDigit(*p_)) return Token::kUnsure;
    while (p_ < end_ && IsDigit(*p_)) ++p_;
    is_float = true;
  }
  if (!is_float) {
    uint64_t v = 0;
    for (const char* d = start + (negative ? 1 : 0); d < integer_end; ++d) {
      if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, *d - '0', &v)) {
        return Token::kUnsure;
      }
    }
    if (!negative) {
      unsigned_ = v;
      return Token::kUnsigned;
    }
    if (v > static_cast<uint64_t>(INT64_MAX) + 1) return Token::kUnsure;
    integer_ = v == static_cast<uint64_t>(INT64_MAX) + 1 ? INT64_MIN : -static_cast<int64_t>(v);
    return Token::kInteger;
  }
  const auto [ptr, ec] = std::from_chars(start, p_, float_);
  if (ec != std::errc() || ptr != p_ || !std::isfinite(float_)) return Token::kUnsure;
  text_.assign(start, p_);
  return Token::kFloat;
}

}  // namespace loadstone::io::json_scan
