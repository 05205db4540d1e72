// Parsing of data type codes: the C++ twin of onnxq/formats/{number,scale,codebook,datatype}.py.
// Each function follows its Python counterpart rule by rule, so a code means the same here and
// there (tests/ops/test_custom_ops.py checks every preset and several codes through the ops).
#include "parse.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace onnxq {

namespace {

// A parsed number code; kind kFloat/kInt/kUint/kExponent as in number.h.
struct Spec {
  onnxq_number n{};
  Num d;  // derived (bits, maxfloat, decode ...)
};

std::string lower_strip(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  std::string out = s.substr(b, e - b);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Text for a one-line message: controls and bytes >= 0x80 as \xNN, text over `keep` cut.
std::string shown(const std::string& s, size_t keep = 40) {
  static const char* hex = "0123456789abcdef";
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < keep; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c >= 0x7f) {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  out += "'";
  if (s.size() > keep) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}

std::string quote(const std::string& s) { return shown(s, kMaxCodeLength); }

// The text without surrounding ASCII whitespace.
std::string strip_space(const std::string& code) {
  size_t b = 0, e = code.size();
  auto space = [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
  };
  while (b < e && space(code[b])) ++b;
  while (e > b && space(code[e - 1])) --e;
  return code.substr(b, e - b);
}

// limits.normalize: strip surrounding ASCII whitespace, check length and characters (ASCII
// letters, digits, '_', '.', '-'; NUL, NBSP and other bytes are refused), lowercase.
std::string normalize(const std::string& code, std::string* out) {
  if (code.size() > kMaxCodeLength)  // surrounding whitespace counts: messages echo the code
    return shown(code) + ": a data type code has at most " + std::to_string(kMaxCodeLength) +
           " characters";
  std::string text = strip_space(code);
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
              c == '-';
    if (!ok)
      return shown(code) + ": unexpected character " + shown(std::string(1, c)) +
             " at position " + std::to_string(i) +
             "; codes use ASCII letters, digits, '_', '.' and '-' only";
    text[i] = c;
  }
  *out = text;
  return "";
}

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

// Reads a run of digits at s[pos]; false when there is none or it has more than kMaxDigits.
bool read_int(const std::string& s, size_t* pos, int* out) {
  size_t b = *pos;
  while (*pos < s.size() && std::isdigit(static_cast<unsigned char>(s[*pos]))) ++*pos;
  if (*pos == b || *pos - b > kMaxDigits) return false;
  *out = std::stoi(s.substr(b, *pos - b));
  return true;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  size_t b = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == sep) {
      parts.push_back(s.substr(b, i - b));
      b = i + 1;
    }
  }
  return parts;
}

std::string join(const std::vector<std::string>& parts, size_t b, size_t e) {
  std::string out;
  for (size_t i = b; i < e; ++i) out += (i > b ? "_" : "") + parts[i];
  return out;
}

const char* kForms =
    "expected eXmY[bZ][fn|fnuz|inuz|ieee], eXm0 (exponent, X >= 5), intN, uintN, "
    "float16/32/64, bfloat16, binary8pP or a torch float8 name";

const std::pair<const char*, const char*> kTorchNames[] = {
    {"float8_e4m3fn", "e4m3fn"},        {"float8_e4m3", "e4m3ieee"},
    {"float8_e5m2", "e5m2"},            {"float8_e4m3fnuz", "e4m3b8fnuz"},
    {"float8_e5m2fnuz", "e5m2b16fnuz"}, {"float8_e4m3b11fnuz", "e4m3b11fnuz"},
    {"float8_e3m4", "e3m4ieee"},        {"float8_e8m0fnu", "e8m0"},
    {"float4_e2m1fn", "e2m1fnuz"},      {"float4_e2m1fn_x2", "e2m1fnuz"},
    {"float6_e2m3fn", "e2m3fnuz"},      {"float6_e3m2fn", "e3m2fnuz"},
    {"float16", "e5m10"},               {"half", "e5m10"},
    {"bfloat16", "e8m7"},               {"float32", "e8m23"},
    {"float", "e8m23"},                 {"float64", "e11m52"},
    {"double", "e11m52"},
};

// number._bare_infnan: the OCP convention for a float code without a suffix.
int bare_infnan(int ebits, int bits) { return ebits >= 5 ? kIeee : bits >= 8 ? kFn : kFnuz; }

std::string finish(Spec* s, const std::string& code) {
  s->d.kind = s->n.kind;
  s->d.ebits = s->n.ebits;
  s->d.mbits = s->n.mbits;
  s->d.bias = s->n.bias;
  s->d.infnan = s->n.infnan;
  std::string e = s->d.derive();
  return e.empty() ? e : quote(code) + ": " + e;
}

// number._parse.
std::string parse_number(const std::string& code, Spec* out) {
  std::string text = lower_strip(code);
  if (text.rfind("torch.", 0) == 0) text = text.substr(6);
  for (const auto& [name, canon] : kTorchNames) {
    if (text == name) {
      text = canon;
      break;
    }
  }
  Spec s;
  size_t pos = 0;
  int ebits = 0, mbits = 0, bias = 0;
  if (!text.empty() && text[0] == 'e' && (pos = 1, read_int(text, &pos, &ebits)) &&
      pos < text.size() && text[pos] == 'm' && (++pos, read_int(text, &pos, &mbits))) {
    bool has_bias = false;
    if (pos < text.size() && text[pos] == 'b') {
      ++pos;
      if (!read_int(text, &pos, &bias)) return quote(code) + " is not a number format: " + kForms;
      has_bias = true;
    }
    std::string suffix = text.substr(pos);
    if (!(suffix.empty() || suffix == "fn" || suffix == "fnuz" || suffix == "inuz" ||
          suffix == "ieee" || suffix == "fnu"))
      return quote(code) + " is not a number format: " + kForms;
    if (ebits < 1)
      return quote(code) + ": a float needs at least 1 exponent bit (eXmY with X >= 1)";
    if (ebits > kMaxFloatExponentBits)  // before 2^(ebits - 1) below
      return quote(code) + ": at most 11 exponent bits are supported, got " +
             std::to_string(ebits);
    if (!has_bias) bias = static_cast<int>((1ll << (ebits - 1)) - 1);
    if (mbits == 0 && ebits >= 5 && (suffix == "fn" || suffix == "fnuz" || suffix == "ieee"))
      return quote(code) + ": e" + std::to_string(ebits) +
             "m0 is the exponent (scale) type and takes no suffix";
    if (mbits == 0 && ebits >= 5 && (suffix.empty() || suffix == "fnu")) {
      s.n = {kExponent, ebits, 0, bias, kNone};
      std::string e = finish(&s, code);
      if (e.empty()) *out = s;
      return e;
    }
    if (suffix == "fnu")
      return quote(code) + ": 'fnu' is only for exponent types such as e8m0fnu";
    if (1 + ebits + mbits > 64) return quote(code) + ": at most 64 bits are supported";
    int infnan = suffix.empty() ? bare_infnan(ebits, 1 + ebits + mbits)
                 : suffix == "ieee" ? kIeee
                 : suffix == "fn"   ? kFn
                 : suffix == "fnuz" ? kFnuz
                                    : kInuz;
    s.n = {kFloat, ebits, mbits, bias, infnan};
    std::string e = finish(&s, code);
    if (e.empty()) *out = s;
    return e;
  }
  bool unsigned_ = text.rfind("uint", 0) == 0;
  if (unsigned_ || text.rfind("int", 0) == 0) {
    std::string digits = text.substr(unsigned_ ? 4 : 3);
    if (all_digits(digits) && digits.size() <= kMaxDigits) {
      int bits = std::stoi(digits);
      int low = unsigned_ ? 1 : 2;
      if (bits < low || bits > 32)
        return quote(code) + ": " + (unsigned_ ? "uint" : "int") + "N needs " +
               std::to_string(low) + " <= N <= 32, got " + std::to_string(bits);
      s.n = unsigned_ ? onnxq_number{kUint, 0, bits, 0, kNone}
                      : onnxq_number{kInt, 0, bits - 1, 0, kNone};
      std::string e = finish(&s, code);
      if (e.empty()) *out = s;
      return e;
    }
  }
  if (text.rfind("binary8p", 0) == 0 && all_digits(text.substr(8)) &&
      text.size() <= 8 + kMaxDigits) {
    int p = std::stoi(text.substr(8));
    if (p < 1 || p > 7)
      return quote(code) + ": binary8pP needs 1 <= P <= 7, got " + std::to_string(p);
    s.n = {kFloat, 8 - p, p - 1, 1 << (7 - p), kInuz};
    std::string e = finish(&s, code);
    if (e.empty()) *out = s;
    return e;
  }
  return quote(code) + " is not a number format: " + kForms;
}

bool is_number(const std::string& code) {
  Spec s;
  return parse_number(code, &s).empty();
}

// -- scale codes (scale.py) ---------------------------------------------------------------

struct Tile {
  int size = 0, subtile = 0, n = 0, m = 0;
};

bool is_pow2(int v) { return v > 0 && (v & (v - 1)) == 0; }

const char* kTileForm = "expected t[T][sS][nNmM] with T, S, M powers of two (t or t0 = channel)";

// TileSpec.parse.
std::string parse_tile(const std::string& text, const std::string& context, Tile* out) {
  std::string where = quote(context) + ": ";
  std::string bad = where + "bad tile " + quote(text) + ": " + kTileForm;
  size_t pos = 1;
  Tile t;
  if (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos])) &&
      !read_int(text, &pos, &t.size))
    return bad;
  if (pos < text.size() && text[pos] == 's') {
    ++pos;
    if (!read_int(text, &pos, &t.subtile)) return bad;
  }
  if (pos < text.size() && text[pos] == 'n') {
    ++pos;
    if (!read_int(text, &pos, &t.n) || pos >= text.size() || text[pos] != 'm') return bad;
    ++pos;
    if (!read_int(text, &pos, &t.m)) return bad;
  }
  if (pos != text.size()) return bad;
  if (t.size && (t.size < 2 || !is_pow2(t.size) || t.size > kMaxTile))
    return where + "tile size " + std::to_string(t.size) + " in " + quote(text) +
           " must be a power of two from 2 to " + std::to_string(kMaxTile);
  if (t.subtile) {
    if (!is_pow2(t.subtile))
      return where + "subtile " + std::to_string(t.subtile) + " in " + quote(text) +
             " must be a power of two";
    if (t.size && t.subtile >= t.size)
      return where + "subtile " + std::to_string(t.subtile) + " in " + quote(text) +
             " must be smaller than the tile " + std::to_string(t.size);
    if (!t.size) return where + quote(text) + ": a channel tile (t0) cannot have a subtile";
  }
  if (t.m) {
    if (!is_pow2(t.m) || t.m < 2 || t.m > kMaxSparseM)
      return where + "sparsity block M=" + std::to_string(t.m) + " in " + quote(text) +
             ": expected 2, 4, 8 or 16";
    if (t.n < 1 || t.n >= t.m)
      return where + "sparsity N=" + std::to_string(t.n) + " in " + quote(text) +
             ": expected 1 <= N < M=" + std::to_string(t.m);
    if (t.size && t.size % t.m)
      return where + "sparsity block M=" + std::to_string(t.m) + " does not divide tile " +
             std::to_string(t.size);
  }
  *out = t;
  return "";
}

struct Scale {
  Spec scale;
  bool has_zero = false, has_ts = false;
  Spec zero, ts;
  std::vector<Tile> tiles;
};

// ScaleSpec._parse plus ScaleSpec.__post_init__. data_is_uint: -1 unknown, 0 no, 1 yes.
std::string parse_scale(const std::string& code, int data_is_uint, Scale* out) {
  std::string text = lower_strip(code);
  std::vector<std::string> segments = split(text, '_');
  for (const auto& seg : segments) {
    if (seg.empty())
      return quote(code) + ": empty segment; expected 1-3 number codes then 0-2 tile codes " +
             "joined by '_' (e8m0_t32, float16_int8_t16n2m4)";
  }
  std::vector<Spec> specs;
  Scale s;
  for (const auto& seg : segments) {
    if (seg[0] == 't') {
      Tile t;
      std::string e = parse_tile(seg, code, &t);
      if (!e.empty()) return e;
      s.tiles.push_back(t);
      continue;
    }
    if (!s.tiles.empty())
      return quote(code) + ": number code " + quote(seg) + " after a tile code; numbers come first";
    Spec n;
    std::string e = parse_number(seg, &n);
    if (!e.empty())
      return quote(code) + ": segment " + quote(seg) + " is neither a tile nor a number: " + e;
    specs.push_back(n);
  }
  if (specs.empty())
    return quote(code) + ": a scale code starts with the scale's number code (e8m0_t32)";
  if (specs.size() > 3)
    return quote(code) + ": at most three number codes (scale, zero, tensor scale)";
  s.scale = specs[0];
  if (specs.size() == 3) {
    s.has_zero = s.has_ts = true;
    s.zero = specs[1];
    s.ts = specs[2];
  } else if (specs.size() == 2) {
    const Spec& second = specs[1];
    bool as_zero = data_is_uint < 0 ? (second.n.kind == kInt || second.n.kind == kUint)
                                    : data_is_uint == 1;
    if (as_zero) {
      s.has_zero = true;
      s.zero = second;
    } else {
      s.has_ts = true;
      s.ts = second;
    }
  }
  std::string where = quote(code) + ": ";
  if (s.scale.n.kind != kFloat && s.scale.n.kind != kExponent)
    return where + "the scale must be a float or exponent type, got " + s.scale.d.name();
  if (s.has_ts) {
    if (s.ts.n.kind != kFloat)
      return where + "a tensor scale must be a float type, got " + s.ts.d.name();
    if (s.scale.n.kind == kExponent)
      return where + "a tensor scale on top of exponent tile scales is not supported; use a " +
             "float tile scale (e4m3fn_float32_t16)";
    if (s.tiles.empty()) return where + "a tensor scale on top of a tensor scale needs tiles";
  }
  if (s.tiles.size() > 2) return where + "at most two tile codes (dim -2, dim -1)";
  if (s.tiles.size() == 2 && s.tiles[0].size == 0 && s.tiles[1].size == 0)
    return where + "a 2-D tile can hold at most one channel (t0) dimension";
  int sparse = 0;
  for (const auto& t : s.tiles) sparse += t.m ? 1 : 0;
  if (sparse > 1) return where + "N:M sparsity on at most one tile dimension";
  *out = std::move(s);
  return "";
}

// -- codebooks (codebook.py) --------------------------------------------------------------

const char* kCbForm =
    "expected cb<index_bits><meta_bits>[f|i[offsets][e[eoffsets]] | p|s<interval>[offsets]]..."
    "_<compute>[_<label>]";

struct Clause {
  std::string text;
  char letter = 'f';
  bool default_offset = false;  // f/i without digits
  std::vector<int> offsets, eoffsets{0};
  int interval = 1;
  size_t count() const { return (default_offset ? 1 : offsets.size()) * eoffsets.size(); }
};

bool label_ok(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!(std::isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'z'))) return false;
  return true;
}

std::string parse_desc(const std::string& desc, const std::string& code,
                       std::vector<Clause>* out) {
  size_t pos = 0;
  auto digits_at = [&](size_t p) {
    size_t q = p;
    while (q < desc.size() && std::isdigit(static_cast<unsigned char>(desc[q]))) ++q;
    return q;
  };
  while (pos < desc.size()) {
    char c = desc[pos];
    Clause cl;
    size_t start = pos;
    if (c == 'f' || c == 'i') {
      cl.letter = c;
      size_t q = digits_at(pos + 1);
      cl.default_offset = q == pos + 1;
      for (size_t k = pos + 1; k < q; ++k) cl.offsets.push_back(desc[k] - '0');
      pos = q;
      if (pos < desc.size() && desc[pos] == 'e') {
        size_t r = digits_at(pos + 1);
        cl.eoffsets.clear();
        if (r == pos + 1) {
          cl.eoffsets = {0, 1};
        } else {
          for (size_t k = pos + 1; k < r; ++k) cl.eoffsets.push_back(desc[k] - '0');
        }
        pos = r;
        cl.text = desc.substr(start, pos - start);
        for (int e : cl.eoffsets) {
          if (e > 3)
            return quote(code) + ": eoffset " + std::to_string(e) + " in clause " +
                   quote(cl.text) + " is outside 0..3; " + kCbForm;
        }
      }
      cl.text = desc.substr(start, pos - start);
    } else if (c == 'p' || c == 's') {
      cl.letter = c;
      size_t q = digits_at(pos + 1);
      pos = q;
      cl.text = desc.substr(start, pos - start);
      if (q > start + 1) {
        cl.interval = desc[start + 1] - '0';
        if (cl.interval == 0)
          return quote(code) + ": interval 0 in clause " + quote(cl.text) + " must be 1..9; " +
                 kCbForm;
        for (size_t k = start + 2; k < q; ++k) cl.offsets.push_back(desc[k] - '0');
      }
      if (cl.offsets.empty()) cl.offsets = {0};
    } else if (c == 'e') {
      std::string after = out->empty() ? "" : " (it follows " + quote(out->back().text) + ")";
      return quote(code) + ": the 'e' modifier must follow an f or i clause" + after + "; " +
             kCbForm;
    } else {
      return quote(code) + ": unexpected " + quote(desc.substr(pos)) + " in description " +
             quote(desc) + "; clauses start with f, i, p or s; " + kCbForm;
    }
    out->push_back(cl);
  }
  return "";
}

// codebook._code_of: the code of value >= 0 in float `s`, or false if not exact and finite.
bool code_of(const Num& s, double value, uint64_t* code) {
  if (!std::isfinite(value) || value < 0) return false;
  if (value == 0) {
    *code = 0;
    return true;
  }
  int e2 = 0;
  std::frexp(value, &e2);
  int exp = e2 - 1;
  int64_t field = static_cast<int64_t>(exp) + s.bias;
  double scaled;
  int64_t base;
  if (field >= 1) {
    scaled = std::ldexp(value, s.mbits - exp);
    base = int64_t(1) << s.mbits;
  } else {
    field = 0;
    scaled = std::ldexp(value, s.mbits - (1 - s.bias));
    base = 0;
  }
  if (scaled != std::floor(scaled) || field >= (int64_t(1) << s.ebits)) return false;
  uint64_t c = (static_cast<uint64_t>(field) << s.mbits) |
               static_cast<uint64_t>(static_cast<int64_t>(scaled) - base);
  if (c >= (1ull << (s.bits - 1)) || s.decode(c) != value) return false;
  *code = c;
  return true;
}

struct Book {
  int ib = 0, mb = 0;
  Spec compute;
  std::string desc, name;
  std::vector<std::vector<double>> maps;  // magnitudes, 0 first
};

std::string values_at(const Book& b, const std::string& clause, int offset,
                      const std::vector<int64_t>& indices, std::vector<double>* out) {
  int64_t zero = int64_t(1) << (b.compute.d.bits - 1), top = (int64_t(1) << b.compute.d.bits) - 1;
  out->assign(1, 0.0);
  for (int64_t idx : indices) {
    if (idx <= zero || idx > top)
      return b.name + ": clause " + quote(clause) + " offset " + std::to_string(offset) +
             " reaches index " + std::to_string(idx) + ", outside the positive indices " +
             std::to_string(zero + 1) + ".." + std::to_string(top) + " of " +
             b.compute.d.name();
    double v = b.compute.d.decode(static_cast<uint64_t>(idx - zero));
    if (!std::isfinite(v))
      return b.name + ": clause " + quote(clause) + " offset " + std::to_string(offset) +
             " lands on index " + std::to_string(idx) + ", which is not finite in " +
             b.compute.d.name();
    out->push_back(v);
  }
  return "";
}

std::string fi_mappings(const Book& b, const Clause& cl, std::vector<std::vector<double>>* out) {
  int npos = (1 << (b.ib - 1)) - 1;
  std::vector<double> natural_values;
  if (cl.letter == 'f') {
    Num fp;
    fp.kind = kFloat;
    fp.ebits = 2;
    fp.mbits = b.ib - 3;
    fp.bias = 1;
    fp.infnan = kFnuz;
    std::string e = fp.derive();
    if (!e.empty()) return b.name + ": " + e;
    for (int c = 1; c <= npos; ++c) natural_values.push_back(fp.decode(static_cast<uint64_t>(c)));
  } else {
    for (int k = 1; k <= npos; ++k) natural_values.push_back(std::ldexp(double(k), 4 - b.ib));
  }
  int64_t zero = int64_t(1) << (b.compute.d.bits - 1), top = (int64_t(1) << b.compute.d.bits) - 1;
  std::vector<int64_t> natural;
  for (double v : natural_values) {
    uint64_t code;
    if (!code_of(b.compute.d, v, &code))
      return b.name + ": clause " + quote(cl.text) + ": the pattern value " +
             std::to_string(v) + " is not representable in " + b.compute.d.name();
    natural.push_back(zero + static_cast<int64_t>(code));
  }
  int64_t shift = top - natural.back();
  std::vector<int64_t> offsets;
  if (cl.default_offset) {
    offsets.push_back(shift);
  } else {
    for (int o : cl.offsets) offsets.push_back(o);
  }
  for (int64_t offset : offsets) {
    std::vector<int64_t> idx;
    for (int64_t i : natural) idx.push_back(i + shift - offset);
    std::vector<double> values;
    std::string e = values_at(b, cl.text, static_cast<int>(offset), idx, &values);
    if (!e.empty()) return e;
    for (int eoff : cl.eoffsets) {
      std::vector<double> scaled;
      for (double v : values) {
        double w = std::ldexp(v, -eoff);
        uint64_t code;
        if (!code_of(b.compute.d, w, &code))
          return b.name + ": clause " + quote(cl.text) + " offset " + std::to_string(offset) +
                 " eoffset " + std::to_string(eoff) + ": " + std::to_string(w) +
                 " is not representable in " + b.compute.d.name();
        scaled.push_back(w);
      }
      out->push_back(scaled);
    }
  }
  return "";
}

std::string ps_mappings(const Book& b, const Clause& cl, std::vector<std::vector<double>>* out) {
  int npos = (1 << (b.ib - 1)) - 1;
  int64_t top = (int64_t(1) << b.compute.d.bits) - 1;
  for (int offset : cl.offsets) {
    std::vector<int64_t> idx;
    int64_t gap = 0;
    for (int i = 0; i < npos; ++i) {
      idx.push_back(top - offset - gap);
      gap += static_cast<int64_t>(cl.interval) * (cl.letter == 'p' ? i + 1 : 1);
    }
    std::vector<int64_t> rev(idx.rbegin(), idx.rend());
    std::vector<double> values;
    std::string e = values_at(b, cl.text, offset, rev, &values);
    if (!e.empty()) return e;
    out->push_back(values);
  }
  return "";
}

// Codebook.parse + __post_init__ + _generate.
std::string parse_codebook(const std::string& code, Book* out) {
  std::string text = lower_strip(code);
  std::vector<std::string> parts = split(text, '_');
  if (parts.size() != 2 && parts.size() != 3)
    return quote(code) + ": expected 2 or 3 parts separated by '_' (description, compute " +
           "type, optional label), got " + std::to_string(parts.size()) + "; " + kCbForm;
  const std::string& head = parts[0];
  if (head.size() < 4 || head.compare(0, 2, "cb") != 0 ||
      !std::isdigit(static_cast<unsigned char>(head[2])) ||
      !std::isdigit(static_cast<unsigned char>(head[3])) || !(head.size() == 4 ||
                                                              label_ok(head.substr(4))))
    return quote(code) + ": " + quote(head) + " must be cb, then single digits index_bits " +
           "and meta_bits, then the description; " + kCbForm;
  Book b;
  b.ib = head[2] - '0';
  b.mb = head[3] - '0';
  b.desc = head.substr(4);
  b.name = quote(text);
  std::string e = parse_number(parts[1], &b.compute);
  if (!e.empty()) return quote(code) + ": bad compute type " + quote(parts[1]) + ": " + e;
  if (parts.size() == 3 && !label_ok(parts[2]))
    return quote(code) + ": label " + quote(parts[2]) + " must be [a-z0-9]+; " + kCbForm;
  if (b.ib < 2 || b.ib > 8)
    return b.name + ": index_bits " + std::to_string(b.ib) + " is outside 2..8; " + kCbForm;
  if (b.mb > 4)
    return b.name + ": meta_bits " + std::to_string(b.mb) + " is outside 0..4; " + kCbForm;
  if (b.compute.n.kind != kFloat)
    return b.name + ": the compute type must be a float format (eXmY...), got " +
           b.compute.d.name() + "; " + kCbForm;
  if (b.ib > b.compute.d.bits)
    return b.name + ": index_bits " + std::to_string(b.ib) + " exceeds the " +
           std::to_string(b.compute.d.bits) + " bits of the compute type " + b.compute.d.name();
  if (b.compute.d.bits > 32)
    return b.name + ": the ops support codebook compute types of at most 32 bits";
  if (!b.desc.empty()) {
    std::vector<Clause> clauses;
    if (!(e = parse_desc(b.desc, text, &clauses)).empty()) return e;
    for (const auto& cl : clauses) {
      if ((cl.letter == 'f' || cl.letter == 'i') && (b.ib < 3 || b.ib > 5))
        return b.name + ": clause " + quote(cl.text) +
               " needs 3..5 index bits (fp3/fp4/fp5, int3/int4/int5), got " +
               std::to_string(b.ib);
    }
    size_t given = 0;
    for (const auto& cl : clauses) given += cl.count();
    if (given != (size_t(1) << b.mb))
      return b.name + ": the description " + quote(b.desc) + " gives " + std::to_string(given) +
             " mapping(s), meta_bits " + std::to_string(b.mb) + " asks for " +
             std::to_string(1 << b.mb);
    for (const auto& cl : clauses) {
      e = (cl.letter == 'f' || cl.letter == 'i') ? fi_mappings(b, cl, &b.maps)
                                                 : ps_mappings(b, cl, &b.maps);
      if (!e.empty()) return e;
    }
  }
  *out = std::move(b);
  return "";
}

// -- presets and data types (datatype.py) -------------------------------------------------

const std::pair<const char*, const char*> kPresets[] = {
    {"mxfp8e5", "e5m2_e8m0_t32"},
    {"mxfp8e4", "e4m3fn_e8m0_t32"},
    {"mxfp8", "e4m3fn_e8m0_t32"},
    {"mxfp6e3", "e3m2fnuz_e8m0_t32"},
    {"mxfp6e2", "e2m3fnuz_e8m0_t32"},
    {"mxfp6", "e2m3fnuz_e8m0_t32"},
    {"mxfp4e2", "e2m1fnuz_e8m0_t32"},
    {"mxfp4", "e2m1fnuz_e8m0_t32"},
    {"mxint8", "int8_e8m0_t32"},
    {"mxint4", "int4_e8m0_t32"},
    {"bfp16", "int8_e8m0_t16"},
    {"bfp8", "int4_e8m0_t32"},
    {"mx9", "int8_e8m0_t16s2"},
    {"mx6", "int5_e8m0_t16s2"},
    {"mx4", "int3_e8m0_t16s2"},
    {"nvfp4", "e2m1fnuz_e4m3fn_float32_t16"},
    {"int8_tensor", "int8_float32"},
    {"int8_channel", "int8_float32_t0"},
    {"int4_channel", "int4_float32_t0"},
    {"uint8_tensor", "uint8_float32_uint8"},
    {"uint8_channel", "uint8_float32_uint8_t0"},
    {"uint4_block32", "uint4_float16_uint8_t32"},
    {"fp8e4_tensor", "e4m3fn_float32"},
    {"fp8e4_channel", "e4m3fn_float32_t0"},
    {"fp8e5_tensor", "e5m2_float32"},
};

std::string preset_list() {
  std::vector<std::string> names;
  for (const auto& p : kPresets) names.push_back(p.first);
  std::sort(names.begin(), names.end());
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

double minint(const Spec& s) {
  return s.n.kind == kInt ? -std::ldexp(1.0, s.d.bits - 1) : 0.0;
}

// The element part of a code: a number code (up to 3 segments) or a codebook (2 or 3); sets
// *take to the number of segments it used.
std::string parse_element(const std::string& code, const std::vector<std::string>& segments,
                          bool codebook, size_t* take, Spec* elem, Book* book) {
  std::string e;
  *take = 1;
  if (codebook) {
    if (segments.size() < 2)
      return quote(code) + ": a codebook data type is cb<I><M>[desc]_<compute>[_label]_<scale>";
    *take = 2;
    if (segments.size() > 2 && !(segments[2].rfind('t', 0) == 0 || is_number(segments[2])))
      *take = 3;
    if (!(e = parse_codebook(join(segments, 0, *take), book)).empty()) return e;
    *elem = book->compute;
    return "";
  }
  for (size_t k = std::min<size_t>(3, segments.size()); k >= 2; --k) {
    if (is_number(join(segments, 0, k))) {
      *take = k;
      break;
    }
  }
  return parse_number(join(segments, 0, *take), elem);
}

// DataType.__post_init__'s rules for a scaled type; sets the subtile (rows, cols), 0 for none.
std::string check_scaled(const std::string& where, const std::string& text, bool codebook,
                         const Num& n, const Scale& s, int* sub_rows, int* sub_cols) {
  if (!codebook && n.kind == kExponent)
    return where + "an exponent type (" + n.name() + ") is a scale, not an element format";
  if (!codebook && n.kind == kUint && !s.has_zero)
    return where + "uint data is asymmetric and needs a zero point (" + text + "_uint8)";
  if (s.has_zero && (codebook || n.kind != kUint))
    return where + "a zero point is only for uint data";
  if (s.has_zero && (s.zero.n.kind == kInt || s.zero.n.kind == kUint)) {
    if (minint(s.zero) > 0 || s.zero.d.maxfloat < n.maxfloat)
      return where + "zero point " + s.zero.d.name() + " cannot hold every " + n.name() +
             " code; use a wider zero type";
  }
  if (s.has_zero && s.scale.n.kind == kExponent)
    return where + "zero points need a float scale, not " + s.scale.d.name();
  if (s.scale.n.kind == kExponent && n.kind == kFloat) {
    // DataType.__post_init__: the steps of the smallest values a float32 tile can put on
    // the element grid are normal float64 numbers
    int low = std::max(n.emax - kFloat32TileReach, n.emin);
    if (low - n.mbits < kMinScaleStepExponent) {
      int most =
          -kMinScaleStepExponent - n.mbits + std::max(1, n.emax + n.bias - kFloat32TileReach);
      return where + "under an exponent scale, " + n.name() + " rounds values down to 2^" +
             std::to_string(low) + " on steps of 2^" + std::to_string(low - n.mbits) +
             ", below float64's normal range (2^" + std::to_string(kMinScaleStepExponent) +
             "); use a bias of at most " + std::to_string(most);
    }
  }
  if (s.scale.n.kind == kExponent) {
    int frac = !codebook && n.kind == kInt ? n.bits - 2 : 0;
    int lowest = -s.scale.n.bias - frac;
    if (lowest < kMinScaleStepExponent)
      return where + "exponent scale " + s.scale.d.name() + " gives " + n.name() +
             " grid steps down to 2^" + std::to_string(lowest) +
             ", below float64's normal range (2^" + std::to_string(kMinScaleStepExponent) +
             "); use a bias of at most " + std::to_string(-kMinScaleStepExponent - frac);
  }
  bool any_sub = false;
  for (const auto& t : s.tiles) any_sub = any_sub || t.subtile;
  if (any_sub) {
    if (s.tiles.size() == 1) {
      *sub_rows = 1;
      *sub_cols = s.tiles[0].subtile;
    } else {
      const Tile &r = s.tiles[0], &c = s.tiles[1];
      *sub_rows = r.subtile ? r.subtile : r.size ? r.size : 1;
      *sub_cols = c.subtile ? c.subtile : c.size ? c.size : 1;
    }
  }
  if (*sub_cols && !codebook && !(n.kind == kInt && s.scale.n.kind == kExponent))
    return where + "a subtile is a codebook's mapping unit or the shared microexponent of " +
           "int elements with an exponent scale (mx6 = int5_e8m0_t16s2)";
  if (codebook && s.scale.n.kind != kExponent)
    return where + "codebooks need an exponent scale such as e8m0";
  return "";
}

// The scale, zero point, tensor scale, tiles, sparsity and subtiles of onnxq_format.
std::string fill_scaled(const std::string& where, const Scale& s, int sub_rows, int sub_cols,
                        onnxq_format* f) {
  f->scaled = 1;
  f->scale = s.scale.n;
  if (s.has_zero) {
    f->has_zero = 1;
    f->zero = s.zero.n;
  }
  if (s.has_ts) {
    f->has_tenscale = 1;
    f->tenscale = s.ts.n;
  }
  f->ntiles = static_cast<int32_t>(s.tiles.size());
  f->sparse_dim = -1;
  for (size_t i = 0; i < s.tiles.size(); ++i) {
    f->tile[i] = s.tiles[i].size;
    if (s.tiles[i].m && f->sparse_m == 0) {
      f->sparse_n = s.tiles[i].n;
      f->sparse_m = s.tiles[i].m;
      f->sparse_dim = static_cast<int32_t>(i);
    }
  }
  f->sub[0] = sub_rows;
  f->sub[1] = sub_cols;
  for (const Spec* w : {&s.scale, s.has_zero ? &s.zero : nullptr, s.has_ts ? &s.ts : nullptr}) {
    if (w && w->d.bits > 32)
      return where + "the ops store scales, zero points and tensor scales in at most 32 " +
             "bits; " + w->d.name() + " has " + std::to_string(w->d.bits);
  }
  return "";
}

// A codebook's index/meta bits and its tables: magnitudes, even flags and signed values.
std::string fill_codebook(const std::string& where, const Num& n, const Book& book,
                          ParsedType* p) {
  p->fmt.cb_index_bits = book.ib;
  p->fmt.cb_meta_bits = book.mb;
  p->generic_codebook = book.desc.empty();
  size_t half = size_t(1) << (book.ib - 1);
  double negzero = n.has_negzero ? -0.0 : 0.0;
  for (const auto& mags : book.maps) {
    for (size_t i = 0; i < half; ++i) {
      uint64_t c = 0;
      if (!code_of(n, mags[i], &c)) return where + "internal: magnitude not representable";
      p->mags.push_back(mags[i]);
      p->even.push_back(c % 2 == 0 ? 1 : 0);
    }
    for (size_t i = 0; i < half; ++i) p->table.push_back(mags[i]);
    p->table.push_back(negzero);
    for (size_t i = 1; i < half; ++i) p->table.push_back(-mags[i]);
  }
  return "";
}

// DataType.parse + DataType.__post_init__ (everything but the registry).
std::string parse_code(const std::string& code, ParsedType* out) {
  std::string text = lower_strip(code);
  std::vector<std::string> segments = split(text, '_');
  bool codebook = text.rfind("cb", 0) == 0;
  size_t take = 1;
  Spec elem;
  Book book;
  std::string e = parse_element(code, segments, codebook, &take, &elem, &book);
  if (!e.empty()) return e;
  std::string rest = join(segments, take, segments.size());
  bool scaled = take < segments.size();
  Scale s;
  if (scaled) {
    int data_is_uint = codebook ? -1 : elem.n.kind == kUint ? 1 : 0;
    if (!(e = parse_scale(rest, data_is_uint, &s)).empty()) return e;
  }
  std::string where = "data type " + quote(text) + ": ";
  const Num& n = elem.d;
  int sub_rows = 0, sub_cols = 0;
  if (!scaled) {
    if (codebook || n.kind != kFloat)
      return where + "only float formats can be unscaled; add a scale such as " +
             (codebook ? text : n.name()) + "_e8m0_t32";
  } else if (!(e = check_scaled(where, text, codebook, n, s, &sub_rows, &sub_cols)).empty()) {
    return e;
  }
  ParsedType p;
  p.code = code;
  p.fmt.elem = elem.n;
  if (scaled && !(e = fill_scaled(where, s, sub_rows, sub_cols, &p.fmt)).empty()) return e;
  if (n.bits > 32 && !codebook)
    return where + "the ops pack element codes of at most 32 bits; " + n.name() + " has " +
           std::to_string(n.bits);
  if (codebook && !(e = fill_codebook(where, n, book, &p)).empty()) return e;
  *out = std::move(p);
  return "";
}

}  // namespace

std::string preset_code(const std::string& text) {
  std::string key;
  if (!normalize(text, &key).empty()) return "";
  for (const auto& [name, code] : kPresets)
    if (key == name) return code;
  return "";
}

std::string parse_dtype(const std::string& text, ParsedType* out) {
  std::string key;
  std::string bad = normalize(text, &key);
  if (!bad.empty()) return bad;
  if (const std::string preset = preset_code(text); !preset.empty()) {
    std::string e = parse_code(preset, out);
    out->code = strip_space(text);
    return e;
  }
  std::string e = parse_code(text, out);
  if (e.empty()) {
    out->code = strip_space(text);  // for messages: no line break (normalize checked the rest)
    return e;
  }
  bool looks_like_code = key.find('_') != std::string::npos;
  for (const char* p : {"e", "int", "uint", "float", "bfloat", "binary", "cb"})
    looks_like_code = looks_like_code || key.rfind(p, 0) == 0;
  if (looks_like_code) return e;
  return quote(text) + " is neither a preset (" + preset_list() + ") nor a data type code: " + e;
}

std::string quote_code(const std::string& text) { return quote(text); }

}  // namespace onnxq
