// A strict JSON reader that sends nlohmann's SAX events several times faster than nlohmann's own
// lexer, for the documents it can vouch for, and hands every other document back. The large
// documents of a checkpoint (shard indexes and safetensors headers of 100,000 tensors) are read
// by it; nlohmann stays the reference for everything it declines, and for every error message.
//
// ScanJson(text, sax) drives `sax` (nlohmann's SAX interface: null, boolean, number_integer,
// number_unsigned, number_float, string, key, start_object, end_object, start_array, end_array)
// and returns:
// - kParsed: `text` is one JSON value, and `sax` received exactly the events, in the order and
//   with the values, that nlohmann::json::sax_parse(text, sax, input_format_t::json,
//   strict = true) sends it; every handler returned true.
// - kRefused: a handler returned false. The events up to and including that one are those
//   nlohmann would have sent, so its sax_parse would have stopped at the same event.
// - kUnsure: the reader met something it does not vouch for: any syntax error, a number beyond
//   the 64-bit integers or double's range, a lone surrogate or \u0000, a byte-order mark, a NUL.
//   What `sax` received is to be thrown away: the caller runs nlohmann's sax_parse on a fresh
//   handler (SaxParse below does), which parses it or names the error with its byte position.
// Never allocates beyond the longest string or number of `text` plus one flag per open
// array or object; no recursion.
#ifndef LOADSTONE_IO_FORMATS_JSON_SCAN_H_
#define LOADSTONE_IO_FORMATS_JSON_SCAN_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace loadstone::io {

enum class ScanResult { kParsed, kRefused, kUnsure };

namespace json_scan {

enum class Token {
  kBeginObject, kEndObject, kBeginArray, kEndArray, kColon, kComma,
  kString, kUnsigned, kInteger, kFloat, kTrue, kFalse, kNull, kEnd, kUnsure,
};

// Tokens of `text`, as nlohmann's lexer reads them where both agree; kUnsure elsewhere.
class Lexer {
 public:
  explicit Lexer(std::string_view text) : p_(text.data()), end_(text.data() + text.size()) {}
  Token Next();
  // The last kString's contents (unescaped), or the last kFloat's text.
  std::string& text() { return text_; }
  uint64_t unsigned_value() const { return unsigned_; }
  int64_t integer_value() const { return integer_; }
  double float_value() const { return float_; }

 private:
  Token String();
  bool Escape();
  Token Number();
  Token Word(std::string_view word, Token token);

  const char* p_;
  const char* end_;
  std::string text_;
  uint64_t unsigned_ = 0;
  int64_t integer_ = 0;
  double float_ = 0;
};

}  // namespace json_scan

namespace json_scan {

// ScanJson's state machine, nlohmann's parser's: each event is sent once its token is read and
// before the next one is, so that a handler's refusal falls on the same event in both.
template <typename Sax>
class Scanner {
 public:
  Scanner(std::string_view text, Sax* sax) : lex_(text), sax_(sax) {}

  ScanResult Run() {
    token_ = lex_.Next();
    while (true) {
      bool opened = false;  // a container with a first value to read
      if (ScanResult r = Value(&opened); r != ScanResult::kParsed) return r;
      if (opened) continue;
      bool more = false;  // a next value of an open container to read
      if (ScanResult r = Close(&more); r != ScanResult::kParsed || !more) return r;
    }
  }

 private:
  static constexpr auto kUnknownSize = static_cast<std::size_t>(-1);

  static ScanResult Sent(bool accepted) {
    return accepted ? ScanResult::kParsed : ScanResult::kRefused;
  }

  // The value at token_: sent whole (a scalar, an empty container), or opened (`*opened`, the
  // next token then its first value).
  ScanResult Value(bool* opened) {
    switch (token_) {
      case Token::kBeginObject: {
        if (!sax_->start_object(kUnknownSize)) return ScanResult::kRefused;
        token_ = lex_.Next();
        if (token_ == Token::kEndObject) return Sent(sax_->end_object());
        if (ScanResult r = Key(); r != ScanResult::kParsed) return r;
        in_array_.push_back(false);
        token_ = lex_.Next();
        *opened = true;
        return ScanResult::kParsed;
      }
      case Token::kBeginArray:
        if (!sax_->start_array(kUnknownSize)) return ScanResult::kRefused;
        token_ = lex_.Next();
        if (token_ == Token::kEndArray) return Sent(sax_->end_array());
        in_array_.push_back(true);
        *opened = true;
        return ScanResult::kParsed;
      case Token::kString: return Sent(sax_->string(lex_.text()));
      case Token::kUnsigned: return Sent(sax_->number_unsigned(lex_.unsigned_value()));
      case Token::kInteger: return Sent(sax_->number_integer(lex_.integer_value()));
      case Token::kFloat: return Sent(sax_->number_float(lex_.float_value(), lex_.text()));
      case Token::kTrue: return Sent(sax_->boolean(true));
      case Token::kFalse: return Sent(sax_->boolean(false));
      case Token::kNull: return Sent(sax_->null());
      default: return ScanResult::kUnsure;
    }
  }

  // After a whole value: closes every container it completes, to the end of the text (`*more`
  // false) or to the next value of an open one (`*more`, token_ then that value).
  ScanResult Close(bool* more) {
    while (!in_array_.empty()) {
      token_ = lex_.Next();
      if (token_ == Token::kComma) {
        token_ = lex_.Next();
        if (!in_array_.back()) {
          if (ScanResult r = Key(); r != ScanResult::kParsed) return r;
          token_ = lex_.Next();
        }
        *more = true;
        return ScanResult::kParsed;
      }
      if (token_ != (in_array_.back() ? Token::kEndArray : Token::kEndObject)) {
        return ScanResult::kUnsure;
      }
      if (!(in_array_.back() ? sax_->end_array() : sax_->end_object())) {
        return ScanResult::kRefused;
      }
      in_array_.pop_back();
    }
    return lex_.Next() == Token::kEnd ? ScanResult::kParsed : ScanResult::kUnsure;
  }

  // The key at token_, sent, and its colon read.
  ScanResult Key() {
    if (token_ != Token::kString) return ScanResult::kUnsure;
    if (!sax_->key(lex_.text())) return ScanResult::kRefused;
    return lex_.Next() == Token::kColon ? ScanResult::kParsed : ScanResult::kUnsure;
  }

  Lexer lex_;
  Sax* sax_;
  Token token_ = Token::kEnd;
  std::vector<bool> in_array_;  // one per open container: true for an array
};

}  // namespace json_scan

template <typename Sax>
ScanResult ScanJson(std::string_view text, Sax* sax) {
  return json_scan::Scanner<Sax>(text, sax).Run();
}

// nlohmann::json::sax_parse(text, sax, json, strict = true), through ScanJson where it vouches
// for `text`; where it does not, `*sax = make()` (a fresh handler) and nlohmann parses. True when
// the text parsed and no handler refused.
template <typename Sax, typename Make>
bool SaxParse(std::string_view text, Sax* sax, Make make) {
  switch (ScanJson(text, sax)) {
    case ScanResult::kParsed: return true;
    case ScanResult::kRefused: return false;
    case ScanResult::kUnsure: break;
  }
  *sax = make();
  return nlohmann::json::sax_parse(text.begin(), text.end(), sax,
                                   nlohmann::json::input_format_t::json, true);
}

}  // namespace loadstone::io

#endif  // LOADSTONE_IO_FORMATS_JSON_SCAN_H_
