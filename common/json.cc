#include "common/json.h"

#include <cstdint>

#include "absl/strings/str_format.h"

namespace taskgrid {

namespace {

// The length of the UTF-8 sequence at the start of `s` (1 to 4), or 0 when
// it is not one: overlong forms, surrogates and code points past U+10FFFF
// are not (RFC 3629).
size_t Utf8Length(absl::string_view s) {
  const auto byte = [&s](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = byte(0);
  if (c < 0x80) return 1;
  size_t n = 0;
  uint32_t cp = 0;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
    cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    cp = c & 0x0F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (s.size() < n) return 0;
  for (size_t i = 1; i < n; ++i) {
    if ((byte(i) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (byte(i) & 0x3F);
  }
  if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10FFFF ||
      (cp >= 0xD800 && cp <= 0xDFFF)) {
    return 0;
  }
  return n;
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsHexDigit(char c) { return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// A recursive descent over RFC 8259's grammar that only says yes or no.
class JsonChecker {
 public:
  explicit JsonChecker(absl::string_view text) : s_(text) {}

  bool Document() {
    SkipSpace();
    if (!Value(0)) return false;
    SkipSpace();
    return pos_ == s_.size();
  }

 private:
  bool AtEnd() const { return pos_ >= s_.size(); }
  char Peek() const { return AtEnd() ? '\0' : s_[pos_]; }

  void SkipSpace() {
    while (!AtEnd() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool Literal(absl::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  bool Value(int depth) {
    switch (Peek()) {
      case '{':
        return depth < kMaxJsonDepth && Container(depth + 1, /*keyed=*/true);
      case '[':
        return depth < kMaxJsonDepth && Container(depth + 1, /*keyed=*/false);
      case '"':
        return String();
      case 't':
        return Literal("true");
      case 'f':
        return Literal("false");
      case 'n':
        return Literal("null");
      default:
        return Number();
    }
  }

  // An array, or an object when `keyed` (its members "key": value); pos_
  // is at the opening bracket.
  bool Container(int depth, bool keyed) {
    const char close = keyed ? '}' : ']';
    ++pos_;
    SkipSpace();
    if (Peek() == close) {
      ++pos_;
      return true;
    }
    for (;;) {
      SkipSpace();
      if (keyed) {
        if (Peek() != '"' || !String()) return false;
        SkipSpace();
        if (Peek() != ':') return false;
        ++pos_;
        SkipSpace();
      }
      if (!Value(depth)) return false;
      SkipSpace();
      if (Peek() != ',') break;
      ++pos_;
    }
    if (Peek() != close) return false;
    ++pos_;
    return true;
  }

  bool String() {
    ++pos_;  // '"'
    while (!AtEnd()) {
      const unsigned char c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return true;
      }
      if (c < 0x20) return false;
      if (c == '\\') {
        ++pos_;
        const char e = Peek();
        if (e == 'u') {
          for (int i = 1; i <= 4; ++i) {
            if (pos_ + i >= s_.size() || !IsHexDigit(s_[pos_ + i])) return false;
          }
          pos_ += 5;
        } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' ||
                   e == 'r' || e == 't') {
          ++pos_;
        } else {
          return false;
        }
        continue;
      }
      const size_t n = Utf8Length(s_.substr(pos_));
      if (n == 0) return false;
      pos_ += n;
    }
    return false;
  }

  // -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?
  bool Number() {
    if (Peek() == '-') ++pos_;
    if (Peek() == '0') {
      ++pos_;
    } else if (IsDigit(Peek())) {
      while (IsDigit(Peek())) ++pos_;
    } else {
      return false;
    }
    if (Peek() == '.') {
      ++pos_;
      if (!IsDigit(Peek())) return false;
      while (IsDigit(Peek())) ++pos_;
    }
    if (Peek() == 'e' || Peek() == 'E') {
      ++pos_;
      if (Peek() == '+' || Peek() == '-') ++pos_;
      if (!IsDigit(Peek())) return false;
      while (IsDigit(Peek())) ++pos_;
    }
    return true;
  }

  absl::string_view s_;
  size_t pos_ = 0;
};

}  // namespace

std::string JsonString(absl::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", c);
        } else if (const size_t n = Utf8Length(s.substr(i)); n == 0) {
          out += "\xEF\xBF\xBD";  // U+FFFD, the replacement character
        } else {
          out.append(s.data() + i, n);
          i += n;
          continue;
        }
    }
    ++i;
  }
  out += '"';
  return out;
}

bool IsJsonValue(absl::string_view text) { return JsonChecker(text).Document(); }

}  // namespace taskgrid
