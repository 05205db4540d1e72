// The data type language of onnxq/formats/ in C++, for the custom ops' `dtype` attribute.
//
// Mirrors number.py, scale.py, codebook.py and datatype.py: the built-in presets, number codes
// (eXmY[bZ][fn|fnuz|inuz|ieee], eXm0, intN, uintN, float16/32/64, bfloat16, binary8pP, torch
// names), scale codes (1-3 number codes then 0-2 tiles t[T][sS][nNmM]) and codebooks
// (cb<I><M>[desc]_<compute>[_label]; implicit ones are generated here, generic ones need the
// ops' Table input). Presets registered at run time in Python are unknown here.
#pragma once

#include <string>
#include <vector>

#include "kernels.h"
#include "onnxq_ops.h"

namespace onnxq {

struct ParsedType {
  onnxq_format fmt{};  // every pointer is null; to_format() points them at the vectors below
  std::vector<double> mags, table;  // implicit codebooks: [maps][half], [maps][2 * half]
  std::vector<uint8_t> even;        // [maps][half]: 1 where the magnitude's compute code is even
  bool generic_codebook = false;    // a codebook with no description: mappings come from Table
  std::string code;                 // the text as given, stripped of surrounding whitespace
};

// Parses a preset name or a data type code as onnxq.datatype() does; "" or an error message.
std::string parse_dtype(const std::string& text, ParsedType* out);

// The data type code of a preset name (in any case, as parse_dtype reads it), or "" when
// `text` names no preset.
std::string preset_code(const std::string& text);

// The code quoted for a one-line message: controls and non-ASCII bytes as \xNN, cut when
// longer than kMaxCodeLength (an attribute can hold anything, NUL and newlines included).
std::string quote_code(const std::string& text);

// Builds the kernels' Format (format.cc). `table` (2^meta_bits x 2^index_bits values by index
// code) replaces the codebook's own mappings when given; generic codebooks need it. "" or an
// error message.
std::string to_format(const ParsedType& p, const std::vector<double>* table, Format* out);

}  // namespace onnxq
