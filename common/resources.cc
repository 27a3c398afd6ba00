#include "common/resources.h"

#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace taskgrid {
namespace {

bool ValidName(absl::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

absl::Status Bad(absl::string_view name, absl::string_view value, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("resource ", name, "=\"",
                                                 absl::CHexEscape(value.substr(0, 64)),
                                                 value.size() > 64 ? "..." : "", "\": ", why));
}

// A decimal "123" or "1.5": its whole part and fraction digits.
bool SplitDecimal(absl::string_view s, absl::string_view* whole, absl::string_view* frac) {
  const size_t dot = s.find('.');
  *whole = s.substr(0, dot);
  *frac = dot == absl::string_view::npos ? absl::string_view() : s.substr(dot + 1);
  if (whole->empty() || whole->size() > 18 || frac->size() > 18) return false;
  if (dot != absl::string_view::npos && frac->empty()) return false;
  for (char c : *whole) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  for (char c : *frac) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// ceil(whole.frac * unit), or -1 past kMaxResourceAmount.
int64_t Scale(absl::string_view whole, absl::string_view frac, int64_t unit) {
  uint64_t w = 0;
  if (!absl::SimpleAtoi(whole, &w) || w > static_cast<uint64_t>(kMaxResourceAmount / unit)) {
    return -1;
  }
  int64_t amount = static_cast<int64_t>(w) * unit;
  if (!frac.empty()) {
    // frac / 10^n of a unit, rounded up; unit <= 2^40 and the fraction
    // below 10^18, so do it digit by digit in 128 bits.
    unsigned __int128 num = 0, den = 1;
    for (char c : frac) {
      num = num * 10 + static_cast<unsigned>(c - '0');
      den *= 10;
    }
    const unsigned __int128 part = (num * static_cast<unsigned __int128>(unit) + den - 1) / den;
    amount += static_cast<int64_t>(part);
  }
  return amount > kMaxResourceAmount ? -1 : amount;
}

struct Unit {
  absl::string_view suffix;
  int64_t bytes;
};
constexpr int64_t kKi = 1024, kK = 1000;
constexpr Unit kMemoryUnits[] = {
    {"KiB", kKi}, {"MiB", kKi* kKi}, {"GiB", kKi* kKi* kKi}, {"TiB", kKi* kKi* kKi* kKi},
    {"Ki", kKi},  {"Mi", kKi* kKi},  {"Gi", kKi* kKi* kKi},  {"Ti", kKi* kKi* kKi* kKi},
    {"KB", kK},   {"MB", kK* kK},    {"GB", kK* kK* kK},     {"TB", kK* kK* kK* kK},
    {"K", kK},    {"M", kK* kK},     {"G", kK* kK* kK},      {"T", kK* kK* kK* kK},
    {"B", 1},
};

}  // namespace

absl::StatusOr<int64_t> ParseResourceAmount(absl::string_view name, absl::string_view value) {
  if (!ValidName(name)) {
    return absl::InvalidArgumentError(absl::StrCat("resource name \"",
                                                   absl::CHexEscape(name.substr(0, 64)),
                                                   "\" must be 1-64 characters of [A-Za-z0-9._-]"));
  }
  if (value.empty()) return Bad(name, value, "no amount");
  absl::string_view whole, frac;
  int64_t amount = -1;
  if (name == "cpu") {
    absl::string_view v = value;
    if (absl::ConsumeSuffix(&v, "m")) {
      if (!SplitDecimal(v, &whole, &frac) || !frac.empty()) {
        return Bad(name, value, "millicores are a whole number (\"500m\")");
      }
      amount = Scale(whole, "", 1);
    } else {
      if (!SplitDecimal(v, &whole, &frac)) {
        return Bad(name, value, "cpu is cores (\"2\", \"0.5\") or millicores (\"500m\")");
      }
      if (frac.size() > 3)
        return Bad(name, value, "cpu is counted in millicores: at most 3 decimals");
      amount = Scale(whole, frac, 1000);
    }
  } else if (name == "memory") {
    absl::string_view number = value;
    int64_t unit = 1;
    for (const Unit& u : kMemoryUnits) {
      if (absl::ConsumeSuffix(&number, u.suffix)) {
        unit = u.bytes;
        break;
      }
    }
    if (!SplitDecimal(number, &whole, &frac)) {
      return Bad(name, value,
                 "memory is bytes with an optional unit: B, KiB, MiB, GiB, TiB (1024s) or KB, MB, "
                 "GB, TB (1000s), e.g. \"4GiB\"");
    }
    amount = Scale(whole, frac, unit);
  } else {
    if (!SplitDecimal(value, &whole, &frac) || !frac.empty()) {
      return Bad(name, value, "a whole count is expected (only cpu and memory take units)");
    }
    amount = Scale(whole, "", 1);
  }
  if (amount < 0) return Bad(name, value, "too large");
  if (amount == 0) return Bad(name, value, "must be more than zero");
  return amount;
}

absl::StatusOr<Resources> ParseResourceList(absl::string_view text) {
  Resources out;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    item = absl::StripAsciiWhitespace(item);
    const size_t eq = item.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "resource \"", absl::CHexEscape(item.substr(0, 64)), "\" is not NAME=AMOUNT"));
    }
    const absl::string_view name = absl::StripAsciiWhitespace(item.substr(0, eq));
    absl::StatusOr<int64_t> amount =
        ParseResourceAmount(name, absl::StripAsciiWhitespace(item.substr(eq + 1)));
    if (!amount.ok()) return amount.status();
    if (!out.emplace(std::string(name), *amount).second) {
      return absl::InvalidArgumentError(absl::StrCat("resource ", name, " is given twice"));
    }
    if (out.size() > kMaxResourceNames) {
      return absl::InvalidArgumentError(
          absl::StrCat("at most ", kMaxResourceNames, " resource names"));
    }
  }
  return out;
}

absl::StatusOr<Resources> ParseResourceMap(
    const google::protobuf::Map<std::string, std::string>& m) {
  if (m.size() > static_cast<size_t>(kMaxResourceNames)) {
    return absl::InvalidArgumentError(
        absl::StrCat(m.size(), " resource names; at most ", kMaxResourceNames));
  }
  Resources out;
  for (const auto& [name, value] : m) {
    absl::StatusOr<int64_t> amount = ParseResourceAmount(name, value);
    if (!amount.ok()) return amount.status();
    out.emplace(name, *amount);
  }
  return out;
}

std::string FormatResourceAmount(absl::string_view name, int64_t amount) {
  if (name == "cpu") {
    if (amount % 1000 == 0) return absl::StrCat(amount / 1000);
    std::string frac = absl::StrCat(1000 + amount % 1000).substr(1);  // 3 digits
    while (frac.back() == '0') frac.pop_back();
    return absl::StrCat(amount / 1000, ".", frac);
  }
  if (name == "memory" && amount > 0) {
    static constexpr Unit kBinary[] = {
        {"TiB", kKi * kKi * kKi * kKi}, {"GiB", kKi * kKi * kKi}, {"MiB", kKi * kKi}, {"KiB", kKi}};
    for (const Unit& u : kBinary) {
      if (amount % u.bytes == 0) return absl::StrCat(amount / u.bytes, u.suffix);
    }
  }
  return absl::StrCat(amount);
}

std::string FormatResources(const Resources& r) {
  std::string out;
  for (const auto& [name, amount] : r) {
    absl::StrAppend(&out, out.empty() ? "" : ",", name, "=", FormatResourceAmount(name, amount));
  }
  return out;
}

void ToResourceMap(const Resources& r, google::protobuf::Map<std::string, std::string>* out) {
  for (const auto& [name, amount] : r) (*out)[name] = FormatResourceAmount(name, amount);
}

int64_t AmountOf(const Resources& r, const std::string& name) {
  auto it = r.find(name);
  return it == r.end() ? 0 : it->second;
}

void AddResources(const Resources& b, Resources* a) {
  for (const auto& [name, amount] : b) {
    int64_t& have = (*a)[name];
    have = amount > std::numeric_limits<int64_t>::max() - have ? std::numeric_limits<int64_t>::max()
                                                               : have + amount;
  }
}

void SubtractResources(const Resources& b, Resources* a) {
  for (const auto& [name, amount] : b) {
    auto it = a->find(name);
    if (it == a->end()) {
      a->emplace(name, -amount);
      continue;
    }
    it->second -= amount;
    if (it->second == 0) a->erase(it);
  }
}

}  // namespace taskgrid
