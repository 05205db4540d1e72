// Unit tests of the library's parser (parse.h), bit packing (kernels.h) and saturation bound
// (quant_internal.h), without Python or onnxruntime. Built as the CMake target
// onnxq_unit_tests (not part of `all`); run by tests/ops/test_cxx_units.py and, under
// ASan/UBSan, by .ci/sanitize. Prints the number of checks and exits 1 when one fails.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels.h"
#include "number.h"
#include "parse.h"
#include "quant_internal.h"

namespace {

int g_checks = 0;
int g_failures = 0;

void check_at(bool ok, const char* what, const std::string& detail, int line) {
  ++g_checks;
  if (ok) return;
  ++g_failures;
  std::fprintf(stderr, "unit_tests.cc:%d: check failed: %s %s\n", line, what, detail.c_str());
}

#define CHECK(cond) check_at((cond), #cond, "", __LINE__)
#define CHECK_MSG(cond, detail) check_at((cond), #cond, (detail), __LINE__)

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// -- parse_dtype: accepted codes --------------------------------------------------------------

using onnxq::ParsedType;

ParsedType accept(const std::string& code, int line) {
  ParsedType p;
  std::string e = onnxq::parse_dtype(code, &p);
  check_at(e.empty(), "accepted", onnxq::quote_code(code) + ": " + e, line);
  return p;
}
#define ACCEPT(code) accept((code), __LINE__)

// The message: not empty, one line (an attribute can hold newlines), bounded, with `phrase`.
void refuse(const std::string& code, const std::string& phrase, int line) {
  ParsedType p;
  std::string e = onnxq::parse_dtype(code, &p);
  const std::string shown = onnxq::quote_code(code) + " -> " + e;
  check_at(!e.empty(), "refused", shown, line);
  check_at(contains(e, phrase), "message names the problem", phrase + " in " + shown, line);
  check_at(e.find('\n') == std::string::npos && e.find('\r') == std::string::npos,
           "one-line message", shown, line);
  check_at(e.size() < 1200, "bounded message", std::to_string(e.size()) + " bytes", line);
}
#define REFUSE(code, phrase) refuse((code), (phrase), __LINE__)

void test_presets() {
  ParsedType p = ACCEPT("mxfp4");
  CHECK(p.code == "mxfp4");
  CHECK(p.fmt.elem.kind == 0 && p.fmt.elem.ebits == 2 && p.fmt.elem.mbits == 1);
  CHECK(p.fmt.elem.infnan == 3);  // fnuz
  CHECK(p.fmt.scaled == 1 && p.fmt.scale.kind == 3 && p.fmt.scale.ebits == 8);
  CHECK(p.fmt.ntiles == 1 && p.fmt.tile[0] == 32 && p.fmt.sub[0] == 0 && p.fmt.sub[1] == 0);
  CHECK(!p.fmt.has_zero && !p.fmt.has_tenscale && p.fmt.sparse_m == 0);
  CHECK(p.fmt.cb_index_bits == 0 && !p.generic_codebook);
  // Presets are case-insensitive and surrounding ASCII whitespace is stripped; code keeps the
  // text as given without that whitespace (for one-line messages), its case too.
  CHECK(ACCEPT("MXFP4").fmt.tile[0] == 32);
  CHECK(ACCEPT(" mxfp4\t").code == "mxfp4");
  CHECK(ACCEPT("\n E2M1FNUZ_E8M0_T32 \r\n").code == "E2M1FNUZ_E8M0_T32");
  ParsedType mx6 = ACCEPT("\r\nmx6\x0b\x0c");
  CHECK(mx6.fmt.elem.kind == 1 && mx6.fmt.tile[0] == 16);
  CHECK(mx6.fmt.sub[0] == 1 && mx6.fmt.sub[1] == 2);
  ParsedType nv = ACCEPT("nvfp4");
  CHECK(nv.fmt.has_tenscale == 1 && nv.fmt.tenscale.kind == 0 && nv.fmt.tenscale.ebits == 8 &&
        nv.fmt.tenscale.mbits == 23);
  CHECK(nv.fmt.scale.kind == 0 && nv.fmt.scale.ebits == 4 && nv.fmt.scale.mbits == 3);
  CHECK(nv.fmt.tile[0] == 16);
  ParsedType u4 = ACCEPT("uint4_block32");
  CHECK(u4.fmt.elem.kind == 2 && u4.fmt.has_zero == 1 && u4.fmt.zero.kind == 2);
  CHECK(u4.fmt.scale.kind == 0 && u4.fmt.scale.ebits == 5 && u4.fmt.scale.mbits == 10);
  ParsedType ch = ACCEPT("int8_channel");
  CHECK(ch.fmt.ntiles == 1 && ch.fmt.tile[0] == 0);  // t0: the whole axis
  CHECK(ACCEPT("int8_tensor").fmt.ntiles == 0);
}

void test_codes() {
  ParsedType e4 = ACCEPT("e4m3fn");
  CHECK(e4.fmt.scaled == 0 && e4.fmt.elem.ebits == 4 && e4.fmt.elem.mbits == 3);
  CHECK(e4.fmt.elem.infnan == 2);
  CHECK(ACCEPT("E5M2").fmt.elem.ebits == 5);
  CHECK(ACCEPT("float32").fmt.elem.mbits == 23);
  CHECK(ACCEPT("e8m23_e8m0_t32").fmt.elem.ebits == 8);
  CHECK(ACCEPT("int32_e8m0_t32").fmt.elem.kind == 1);
  CHECK(ACCEPT("uint32_float32_uint32_t0").fmt.zero.kind == 2);
  CHECK(ACCEPT("e4m3b00011").fmt.elem.bias == 11);
  CHECK(ACCEPT("int8_e10m0_t32").fmt.scale.ebits == 10);
  CHECK(ACCEPT("e6m5_e10m0").fmt.ntiles == 0);
  CHECK(ACCEPT("float8_e4m3fnuz_e8m0_t32").fmt.elem.infnan == 3);
  CHECK(ACCEPT("torch.float8_e5m2_e8m0_t32").fmt.elem.ebits == 5);
  CHECK(ACCEPT("binary8p3_e8m0_t32").fmt.elem.mbits == 2);
  CHECK(ACCEPT("e4m3fn_e8m0_t65536").fmt.tile[0] == 65536);
  CHECK(ACCEPT("e4m3fn_e8m0_t").fmt.tile[0] == 0);
  CHECK(ACCEPT("e4m3fn_e8m0_t00032").fmt.tile[0] == 32);
  ParsedType sp = ACCEPT("e2m1fnuz_e8m0_t32n2m4");
  CHECK(sp.fmt.sparse_n == 2 && sp.fmt.sparse_m == 4 && sp.fmt.sparse_dim == 0);
  CHECK(ACCEPT("e2m1fnuz_e8m0_t32").fmt.sparse_dim == -1);
  ParsedType two = ACCEPT("int8_e8m0_t8_t4");
  CHECK(two.fmt.ntiles == 2 && two.fmt.tile[0] == 8 && two.fmt.tile[1] == 4);
  // A code of exactly kMaxCodeLength characters is accepted, one more is refused.
  std::string label(onnxq::kMaxCodeLength - std::strlen("cb41fi_e2m2fnuz__e8m0_t8s4"), 'a');
  std::string longest = "cb41fi_e2m2fnuz_" + label + "_e8m0_t8s4";
  CHECK(longest.size() == onnxq::kMaxCodeLength);
  ACCEPT(longest);
  REFUSE("cb41fi_e2m2fnuz_" + label + "a_e8m0_t8s4", "at most 128 characters");
}

void test_codebooks() {
  ParsedType cb = ACCEPT("cb41fi_e2m2fnuz_e8m0_t8s4");
  CHECK(cb.fmt.cb_index_bits == 4 && cb.fmt.cb_meta_bits == 1 && !cb.generic_codebook);
  CHECK(cb.fmt.sub[0] == 1 && cb.fmt.sub[1] == 4);
  // Two mappings of 2^(4-1) magnitudes; the table holds them signed, 2^4 a mapping.
  CHECK(cb.mags.size() == 16 && cb.even.size() == 16 && cb.table.size() == 32);
  CHECK(cb.mags[0] == 0.0 && cb.table[0] == 0.0);
  for (size_t m = 0; m < 2; ++m)
    for (size_t i = 1; i < 8; ++i) {
      CHECK(cb.mags[m * 8 + i] > cb.mags[m * 8 + i - 1]);  // ascending
      CHECK(cb.table[m * 16 + 8 + i] == -cb.table[m * 16 + i]);
    }
  CHECK(cb.fmt.cb_mags == nullptr && cb.fmt.cb_table == nullptr);  // to_format points them
  onnxq::Format f;
  std::string e = onnxq::to_format(cb, nullptr, &f);
  CHECK_MSG(e.empty(), e);
  CHECK(f.codebook() && f.code_bits() == 4 && f.meta_bits() == 1 && f.has_meta());
  ParsedType ie = ACCEPT("cb51ie_e2m3_mx6_e8m0_t16s2");
  CHECK(ie.fmt.cb_index_bits == 5 && ie.fmt.cb_meta_bits == 1);

  // A generic codebook (no description) takes its mappings from the ops' Table input.
  ParsedType g;
  e = onnxq::parse_dtype("cb41_e2m2fnuz_e8m0_t8s4", &g);
  CHECK_MSG(e.empty(), e);
  CHECK(g.generic_codebook && g.mags.empty() && g.table.empty());
  e = onnxq::to_format(g, nullptr, &f);
  CHECK_MSG(contains(e, "generic codebook") && contains(e, "Table"), e);
  e = onnxq::to_format(g, &cb.table, &f);  // the implicit codebook's mappings as the table
  CHECK_MSG(e.empty(), e);
  CHECK(f.codebook() && f.code_bits() == 4);
}

void test_malformed() {
  REFUSE("", "neither a preset");
  REFUSE("   ", "neither a preset");
  REFUSE("mxfp44", "neither a preset");
  REFUSE("nope", "neither a preset");
  // NUL, non-ASCII and punctuation: refused by character, shown escaped.
  REFUSE(std::string("mxfp4\0garbage", 13), "unexpected character");
  REFUSE(std::string("\0mxfp4", 6), "unexpected character");
  REFUSE("mx fp4", "unexpected character");
  REFUSE("\xc2\xa0mxfp4", "unexpected character");
  REFUSE("\x1cmxfp4", "unexpected character");
  REFUSE("e4m3fn_e8m0_t32;", "unexpected character");
  REFUSE("mxfp4\nmxfp8", "unexpected character");
  // Numbers out of range or with too many digits.
  REFUSE("e9999999999m2", "is not a number format");
  REFUSE("e99999m2", "at most 11 exponent bits");
  REFUSE("e12m3", "11 exponent bits");
  REFUSE("e11m20b1022", "2^1024");
  REFUSE("e4m3b000011", "is not a number format");
  REFUSE("e1m62", "52 mantissa bits");
  REFUSE("int33_e8m0_t32", "N <= 32");
  REFUSE("int0000000008_e8m0_t32", "is not a number format");
  // What the ops cannot store.
  REFUSE("float64", "at most 32 bits");
  REFUSE("e8m24_e8m0_t32", "at most 32 bits");
  REFUSE("e4m3fn_float64_t32", "at most 32 bits");
  REFUSE("e2m1fnuz_e4m3fn_float64_t16", "at most 32 bits");
  REFUSE("cb41_float64_e8m0_t32", "at most 32 bits");
  // Data type rules (DataType.__post_init__).
  REFUSE("int8", "only float formats can be unscaled");
  REFUSE("e8m0_e8m0_t32", "exponent type");
  REFUSE("uint8_e8m0_t32", "needs a zero point");
  REFUSE("int8_float32_uint8", "a tensor scale must be a float type");
  REFUSE("uint8_e8m0_uint8_t32", "zero points need a float scale");
  REFUSE("uint8_float32_int4_t32", "cannot hold every uint8 code");
  REFUSE("cb41fi_e2m2fnuz_float32_t8s4", "codebooks need an exponent scale");
  REFUSE("e4m3fn_e8m0_t32s2", "subtile");
  REFUSE("int8_e11m0_t32", "at most 10 bits");
  // Tiles and sparsity.
  REFUSE("e4m3fn_e8m0_t131072", "bad tile");
  REFUSE("e4m3fn_e8m0_t65537", "power of two");
  REFUSE("e4m3fn_e8m0_t1", "power of two");
  REFUSE("e4m3fn_e8m0_t99999999999999999999", "bad tile");
  REFUSE("e2m1fnuz_e8m0_t32n2m32", "2, 4, 8 or 16");
  REFUSE("e2m1fnuz_e8m0_t32n4m4", "1 <= N < M");
  REFUSE("int5_e8m0_t16s3", "power of two");
  REFUSE("int8_e8m0_t8_t4_t2", "two tile codes");
  // Codebooks.
  REFUSE("cb4", "codebook");
  REFUSE("cb_e2m2fnuz_e8m0_t8s4", "cb");
  REFUSE("cb91fi_e2m2fnuz_e8m0_t8s4", "index_bits");
  REFUSE("cb41fi_int4_e8m0_t8s4", "float format");
}

void test_overlong() {
  // Whatever the length, the message quotes a bounded prefix and says how long the text was.
  for (size_t n : {size_t(129), size_t(1000), size_t(1) << 20}) {
    std::string code(n, 'e');
    ParsedType p;
    std::string e = onnxq::parse_dtype(code, &p);
    CHECK_MSG(contains(e, "at most 128 characters"), e.substr(0, 200));
    CHECK_MSG(contains(e, "(" + std::to_string(n) + " bytes)"), e.substr(0, 200));
    CHECK(e.size() < 600);
  }
  // Surrounding whitespace counts toward the limit (messages echo the code).
  REFUSE(std::string(200, ' ') + "mxfp4", "at most 128 characters");
  std::string q = onnxq::quote_code(std::string("a\n\x01\xff", 4));
  CHECK_MSG(q == "'a\\x0a\\x01\\xff'", q);
  q = onnxq::quote_code(std::string(5000, 'x'));
  CHECK_MSG(q.size() < 200 && contains(q, "(5000 bytes)"), q);
}

// -- bit packing ------------------------------------------------------------------------------

void test_pack_known_bytes() {
  const uint8_t four[] = {1, 2, 3};
  uint8_t out[4] = {0xAA, 0xAA, 0xAA, 0xAA};
  CHECK(onnxq::pack_bits(four, 1, 3, 4, nullptr, out) == 3);
  CHECK(out[0] == 0x21 && out[1] == 0x03 && out[2] == 0xAA);  // LSB first; high bits zero
  const uint16_t three[] = {7, 0, 5};
  std::memset(out, 0xAA, sizeof out);
  onnxq::pack_bits(three, 2, 3, 3, nullptr, out);
  CHECK(out[0] == 0x47 && out[1] == 0x01 && out[2] == 0xAA);
  const uint8_t ones[] = {1, 0, 1, 1, 0, 0, 0, 1, 1};
  std::memset(out, 0xAA, sizeof out);
  onnxq::pack_bits(ones, 1, 9, 1, nullptr, out);
  CHECK(out[0] == 0x8D && out[1] == 0x01);
  // Bits above `bits` are not packed.
  const uint8_t wide[] = {0xF1, 0x32};
  onnxq::pack_bits(wide, 1, 2, 4, nullptr, out);
  CHECK(out[0] == 0x21);
  CHECK(onnxq::packed_nbytes(0, 7) == 0 && onnxq::packed_nbytes(1, 1) == 1 &&
        onnxq::packed_nbytes(8, 1) == 1 && onnxq::packed_nbytes(9, 1) == 2 &&
        onnxq::packed_nbytes(3, 32) == 12 && onnxq::packed_nbytes(5, 3) == 2);
}

// Pack then unpack `count` random codes of `bits` bits stored `width` bytes wide.
void round_trip(int bits, int width, int64_t count, std::mt19937_64& rng,
                const onnxq::ParallelFor* pf) {
  const uint64_t m = bits >= 64 ? ~0ull : (1ull << bits) - 1;
  // At least one byte: count 0 passes real (non-null) pointers, as the library's callers do.
  const size_t nbytes = static_cast<size_t>(std::max<int64_t>(count * width, 1));
  std::vector<uint8_t> codes(nbytes), back(nbytes, 0xEE);
  std::vector<uint64_t> want(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    uint64_t v = rng();
    onnxq::store_code(codes.data(), width, i, v);  // garbage above `bits` must not leak
    want[i] = onnxq::load_code(codes.data(), width, i) & m;
  }
  std::vector<uint8_t> packed(static_cast<size_t>(onnxq::packed_nbytes(count, bits)) + 1, 0xCD);
  int64_t n = onnxq::pack_bits(codes.data(), width, count, bits, nullptr, packed.data(), pf);
  onnxq::unpack_bits(packed.data(), bits, count, nullptr, back.data(), width, pf);
  bool same = n == count && packed.back() == 0xCD;  // nothing written past the stream
  for (int64_t i = 0; i < count && same; ++i)
    same = onnxq::load_code(back.data(), width, i) == want[i];
  int tail = static_cast<int>((count * bits) % 8);
  if (tail && count) same = same && (packed[packed.size() - 2] >> tail) == 0;  // padding is 0
  CHECK_MSG(same, "bits " + std::to_string(bits) + ", width " + std::to_string(width) +
                      ", count " + std::to_string(count) + (pf ? ", parallel" : ""));
}

void test_pack_round_trips() {
  std::mt19937_64 rng(15);
  for (int bits = 1; bits <= 32; ++bits)
    for (int width : {1, 2, 4, 8}) {
      if (bits > 8 * width) continue;
      for (int64_t count : {0, 1, 2, 7, 8, 9, 63, 1000})
        round_trip(bits, width, count, rng, nullptr);
    }
  // More codes than one parallel chunk: the chunks meet on byte boundaries.
  onnxq::ParallelFor pf = onnxq::default_parallel_for(4);
  for (int bits : {1, 2, 3, 4, 5, 8, 13, 32}) {
    int width = bits <= 8 ? 1 : 4;
    round_trip(bits, width, (int64_t(1) << 17) + 77, rng, &pf);
    round_trip(bits, width, (int64_t(1) << 17) + 77, rng, nullptr);
  }
}

void test_pack_masked() {
  std::mt19937_64 rng(3);
  for (int bits : {1, 3, 4, 8, 11, 32}) {
    const int width = bits <= 8 ? 1 : 4;
    const int64_t count = 301;
    std::vector<uint8_t> codes(count * width), back(count * width, 0xEE), mask(count);
    int64_t kept = 0;
    for (int64_t i = 0; i < count; ++i) {
      onnxq::store_code(codes.data(), width, i, rng() & ((1ull << bits) - 1));
      mask[i] = (rng() % 3) != 0;
      kept += mask[i];
    }
    std::vector<uint8_t> packed(onnxq::packed_nbytes(kept, bits) + 1, 0xCD);
    int64_t n = onnxq::pack_bits(codes.data(), width, count, bits, mask.data(), packed.data());
    onnxq::unpack_bits(packed.data(), bits, count, mask.data(), back.data(), width);
    bool same = n == kept && packed.back() == 0xCD;
    for (int64_t i = 0; i < count && same; ++i)
      same = onnxq::load_code(back.data(), width, i) ==
             (mask[i] ? onnxq::load_code(codes.data(), width, i) : 0);
    CHECK_MSG(same, "masked, bits " + std::to_string(bits));
  }
  // Nothing kept: nothing written.
  const uint8_t codes[2] = {1, 1}, none[2] = {0, 0};
  uint8_t out = 0xCD;
  CHECK(onnxq::pack_bits(codes, 1, 2, 4, none, &out) == 0 && out == 0xCD);
}

// -- product_bound: ints over 24 bits decode through float32(q) ------------------------------
// uint26 (top 2^26 - 1) under the float16 scale 9/8192 into float16, whose product limit is
// 65520 - 2^-9 = 33546239/512. t = limit / scale = 33546239 * 16 / 9 = 59637758.2, so the
// exact product allows 59637758 (times 9/8192: 65519.99780 < 65519.99805). Its float32 value
// is 59637760 (spacing 4: the tie 14909439.5 rounds to even), which decodes to 65520 exactly:
// Inf in float16. The float32 below, 59637756, has the odd mantissa 6520831, so the midpoint
// 59637758 rounds up and the bound is 59637757 (float32 59637756: 65519.99561).
void test_product_bound() {
  onnxq::Num u26;
  u26.kind = onnxq::kUint;
  u26.mbits = 26;  // a uint's width
  CHECK(u26.derive().empty() && u26.maxfloat == 67108863.0);
  const double limit = 65520.0 - 1.0 / 512.0;
  CHECK(onnxq::kern::product_bound(9.0f / 8192.0f, u26, u26.maxfloat, limit) == 59637757.0);
  CHECK(onnxq::kern::int_below(59637760.0) == 59637757.0);
  // below 2^24 a step is one code; 2^24 + 2 -> 2^24 + 1 (the tie 2^24 + 1 rounds to even 2^24)
  CHECK(onnxq::kern::int_below(16777216.0) == 16777215.0);
  CHECK(onnxq::kern::int_below(16777218.0) == 16777217.0);
  // a zero scale has no bound; narrower ints are unchanged: uint20, 65519.998 / 2^-3 -> 524159
  CHECK(onnxq::kern::product_bound(0.0f, u26, u26.maxfloat, limit) == u26.maxfloat);
  onnxq::Num u20;
  u20.kind = onnxq::kUint;
  u20.mbits = 20;
  CHECK(u20.derive().empty());
  CHECK(onnxq::kern::product_bound(0.125f, u20, u20.maxfloat, limit) == 524159.0);
}

}  // namespace

int main() {
  test_presets();
  test_codes();
  test_codebooks();
  test_malformed();
  test_overlong();
  test_pack_known_bytes();
  test_pack_round_trips();
  test_pack_masked();
  test_product_bound();
  std::printf("onnxq_unit_tests: %d checks, %d failed\n", g_checks, g_failures);
  return g_failures ? 1 : 0;
}
