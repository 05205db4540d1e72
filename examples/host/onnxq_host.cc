// onnxq_host: run an onnxq-quantized ONNX model through the onnxruntime C API, without Python.
//
//   onnxq_host --model M.onnx --ops libonnxq_ops.so --input NAME=FILE.npy ... --output-dir DIR
//              [--threads N] [--cuda [DEVICE]]
//
// --cuda runs the model on onnxruntime's CUDA execution provider (device 0 unless DEVICE is
// given), where onnxq's QuantizeMX / DequantizeMX run the Triton kernels the library embeds
// (docs/gpu.md); other nodes fall back to the CPU as onnxruntime places them. It needs an
// onnxruntime built with CUDA (onnxruntime-gpu's library): with any other, the CUDA provider
// cannot be created and onnxq_host says so (status 1).
//
// Registers onnxq's custom-op library (QuantizeMX / DequantizeMX / CodebookLookup), reads each
// input from a .npy file (format 1.0/2.0/3.0 headers; float32, float16, float64, int8/16/32/64,
// uint8/16/32/64, bool; C order), runs the model on the CPU and writes every output to
// DIR/<output name>.npy (characters other than [A-Za-z0-9._-] in the name become '_').
//
// Every failure - bad arguments, a missing model or library, an input of the wrong name, type
// or shape, an onnxruntime error - prints one line "onnxq_host: error: ..." on stderr and exits
// with status 1 (2 for bad command-line usage). Only the onnxruntime C API is used, with the
// API version of the headers it was built against (ORT_API_VERSION): the C API is append-only,
// so a newer runtime (the one the Python wheel ships) serves it.

#include <onnxruntime_c_api.h>

#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

constexpr int kUsageError = 2;
constexpr int kRunError = 1;

struct Error : std::runtime_error {
  explicit Error(const std::string& message, int code = kRunError)
      : std::runtime_error(message), status(code) {}
  int status;
};

// Collapses whitespace runs (onnxruntime messages can span lines) so every error is one line.
std::string OneLine(const std::string& text) {
  std::string out;
  bool space = false;
  for (char c : text) {
    if (c == '\n' || c == '\r' || c == '\t' || c == ' ') {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// ---------------------------------------------------------------------------------------------
// Element types: onnxruntime's enum <-> numpy's descr.

struct TypeInfo {
  ONNXTensorElementDataType onnx;
  const char* name;   // for messages
  const char* descr;  // numpy descr, little-endian
  size_t size;
};

const TypeInfo kTypes[] = {
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, "float32", "<f4", 4},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, "float16", "<f2", 2},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE, "float64", "<f8", 8},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, "int64", "<i8", 8},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, "int32", "<i4", 4},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16, "int16", "<i2", 2},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8, "int8", "|i1", 1},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64, "uint64", "<u8", 8},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32, "uint32", "<u4", 4},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16, "uint16", "<u2", 2},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, "uint8", "|u1", 1},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL, "bool", "|b1", 1},
};

const TypeInfo* TypeFromOnnx(ONNXTensorElementDataType t) {
  for (const TypeInfo& info : kTypes)
    if (info.onnx == t) return &info;
  return nullptr;
}

const TypeInfo* TypeFromDescr(std::string descr) {
  // Single-byte types may be written with any byte-order mark; '=' is native (little-endian
  // on every platform this builds for).
  if (descr.size() == 3 && (descr[0] == '=' || descr[0] == '<' || descr[0] == '|')) {
    for (const TypeInfo& info : kTypes) {
      if (descr.substr(1) != std::string(info.descr).substr(1)) continue;
      if (info.size == 1 || descr[0] != '|') return &info;
    }
  }
  return nullptr;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ",";
    s += shape[i] < 0 ? std::string("?") : std::to_string(shape[i]);
  }
  return s + "]";
}

// ---------------------------------------------------------------------------------------------
// .npy files (https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html).

struct NpyHeader {
  const TypeInfo* type = nullptr;
  std::vector<int64_t> shape;
  size_t data_offset = 0;
};

struct File {
  explicit File(FILE* f) : f(f) {}
  ~File() {
    if (f) fclose(f);
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  FILE* f;
};

// The value that follows 'key': in the header's dict literal, with whitespace skipped.
size_t FindValue(const std::string& dict, const std::string& key, const std::string& where) {
  size_t k = dict.find("'" + key + "'");
  if (k == std::string::npos) k = dict.find("\"" + key + "\"");
  if (k == std::string::npos) throw Error(where + ": .npy header has no '" + key + "'");
  size_t colon = dict.find(':', k + key.size() + 2);
  if (colon == std::string::npos) throw Error(where + ": malformed .npy header");
  size_t v = colon + 1;
  while (v < dict.size() && (dict[v] == ' ' || dict[v] == '\t')) ++v;
  return v;
}

NpyHeader ParseNpyHeader(FILE* f, const std::string& where) {
  unsigned char magic[8];
  if (fread(magic, 1, 8, f) != 8 || memcmp(magic, "\x93NUMPY", 6) != 0)
    throw Error(where + ": not a .npy file");
  const int major = magic[6];
  size_t header_len = 0, prefix = 0;
  if (major == 1) {
    unsigned char b[2];
    if (fread(b, 1, 2, f) != 2) throw Error(where + ": truncated .npy header");
    header_len = b[0] | (size_t(b[1]) << 8);
    prefix = 10;
  } else if (major == 2 || major == 3) {
    unsigned char b[4];
    if (fread(b, 1, 4, f) != 4) throw Error(where + ": truncated .npy header");
    header_len = b[0] | (size_t(b[1]) << 8) | (size_t(b[2]) << 16) | (size_t(b[3]) << 24);
    prefix = 12;
  } else {
    throw Error(where + ": unsupported .npy format version " + std::to_string(major));
  }
  if (header_len > (size_t(1) << 24)) throw Error(where + ": .npy header too large");
  std::string dict(header_len, '\0');
  if (fread(&dict[0], 1, header_len, f) != header_len)
    throw Error(where + ": truncated .npy header");

  NpyHeader h;
  h.data_offset = prefix + header_len;

  size_t v = FindValue(dict, "descr", where);
  if (v >= dict.size() || (dict[v] != '\'' && dict[v] != '"'))
    throw Error(where + ": unsupported .npy descr (structured arrays are not supported)");
  size_t end = dict.find(dict[v], v + 1);
  if (end == std::string::npos) throw Error(where + ": malformed .npy descr");
  const std::string descr = dict.substr(v + 1, end - v - 1);
  h.type = TypeFromDescr(descr);
  if (!h.type)
    throw Error(where + ": unsupported .npy dtype '" + descr +
                "' (little-endian float16/32/64, int8/16/32/64, uint8/16/32/64 or bool)");

  v = FindValue(dict, "fortran_order", where);
  const bool fortran = dict.compare(v, 4, "True") == 0;
  if (!fortran && dict.compare(v, 5, "False") != 0)
    throw Error(where + ": malformed .npy fortran_order");

  v = FindValue(dict, "shape", where);
  if (v >= dict.size() || dict[v] != '(') throw Error(where + ": malformed .npy shape");
  end = dict.find(')', v);
  if (end == std::string::npos) throw Error(where + ": malformed .npy shape");
  const std::string dims = dict.substr(v + 1, end - v - 1);
  size_t i = 0;
  while (i < dims.size()) {
    while (i < dims.size() && (dims[i] == ' ' || dims[i] == ',')) ++i;
    if (i >= dims.size()) break;
    size_t j = i;
    while (j < dims.size() && dims[j] >= '0' && dims[j] <= '9') ++j;
    if (j == i || j - i > 15) throw Error(where + ": malformed .npy shape '(" + dims + ")'");
    h.shape.push_back(std::stoll(dims.substr(i, j - i)));
    i = j;
    while (i < dims.size() && dims[i] == 'L') ++i;  // Python 2 longs
  }
  if (fortran && h.shape.size() > 1)
    throw Error(where + ": Fortran-order .npy arrays are not supported (save a C-order array)");
  return h;
}

size_t ElementCount(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

void WriteNpy(const std::string& path, const TypeInfo& type, const std::vector<int64_t>& shape,
              const void* data) {
  std::string dict = std::string("{'descr': '") + type.descr +
                     "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) {
    dict += std::to_string(shape[i]);
    if (shape.size() == 1 || i + 1 < shape.size()) dict += ",";
    if (i + 1 < shape.size()) dict += " ";
  }
  dict += "), }";
  // Pad with spaces and a newline so that the data starts on a 64-byte boundary.
  size_t prefix = 10;
  size_t total = prefix + dict.size() + 1;
  if ((total + 63) / 64 * 64 - prefix > 65535) prefix = 12;  // version 2.0 header
  total = prefix + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict += '\n';
  const size_t len = dict.size();

  File out(fopen(path.c_str(), "wb"));
  if (!out.f) throw Error("cannot write " + path + ": " + strerror(errno));
  std::string head("\x93NUMPY", 6);
  if (prefix == 10) {
    head += '\x01';
    head += '\x00';
    head += static_cast<char>(len & 0xff);
    head += static_cast<char>((len >> 8) & 0xff);
  } else {
    head += '\x02';
    head += '\x00';
    for (int s = 0; s < 32; s += 8) head += static_cast<char>((len >> s) & 0xff);
  }
  const size_t bytes = ElementCount(shape) * type.size;
  if (fwrite(head.data(), 1, head.size(), out.f) != head.size() ||
      fwrite(dict.data(), 1, dict.size(), out.f) != dict.size() ||
      (bytes && fwrite(data, 1, bytes, out.f) != bytes) || fflush(out.f) != 0)
    throw Error("cannot write " + path + ": " + strerror(errno));
}

// ---------------------------------------------------------------------------------------------
// onnxruntime, through the C API.

const OrtApi* g_ort = nullptr;

void Check(OrtStatus* status, const std::string& what) {
  if (!status) return;
  std::string message = g_ort->GetErrorMessage(status);
  g_ort->ReleaseStatus(status);
  throw Error(what + ": " + message);
}

// A small owner for onnxruntime objects: the release function is looked up at destruction.
template <typename T>
class Ptr {
 public:
  using Releaser = void(ORT_API_CALL*)(T*);
  explicit Ptr(Releaser release) : release_(release) {}
  ~Ptr() {
    if (p_) release_(p_);
  }
  Ptr(const Ptr&) = delete;
  Ptr& operator=(const Ptr&) = delete;
  Ptr(Ptr&& other) noexcept : p_(other.p_), release_(other.release_) { other.p_ = nullptr; }
  T** out() { return &p_; }
  T* get() const { return p_; }

 private:
  T* p_ = nullptr;
  Releaser release_;
};

struct TensorDesc {
  const TypeInfo* type = nullptr;
  ONNXTensorElementDataType onnx_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  std::vector<int64_t> shape;  // -1: any size
};

TensorDesc DescribeTypeInfo(const OrtTypeInfo* info, const std::string& what) {
  ONNXType kind;
  Check(g_ort->GetOnnxTypeFromTypeInfo(info, &kind), what);
  if (kind != ONNX_TYPE_TENSOR) throw Error(what + " is not a tensor (sequences and maps are not supported)");
  const OrtTensorTypeAndShapeInfo* tensor = nullptr;
  Check(g_ort->CastTypeInfoToTensorInfo(info, &tensor), what);
  TensorDesc d;
  Check(g_ort->GetTensorElementType(tensor, &d.onnx_type), what);
  d.type = TypeFromOnnx(d.onnx_type);
  size_t rank = 0;
  Check(g_ort->GetDimensionsCount(tensor, &rank), what);
  d.shape.resize(rank);
  if (rank) Check(g_ort->GetDimensions(tensor, d.shape.data(), rank), what);
  return d;
}

std::string TypeName(const TensorDesc& d) {
  return d.type ? d.type->name : "onnx type " + std::to_string(static_cast<int>(d.onnx_type));
}

std::string SafeFileName(const std::string& name) {
  std::string out;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    out += ok ? c : '_';
  }
  if (out.empty() || out == "." || out == "..") out = "output" + out;
  return out;
}

struct Options {
  std::string model;
  std::string ops;
  std::vector<std::pair<std::string, std::string>> inputs;  // name, file
  std::string output_dir;
  int threads = 0;
  int cuda_device = -1;  // -1: CPU only
};

const char kUsage[] =
    "usage: onnxq_host --model MODEL.onnx --ops LIBONNXQ_OPS.so --input NAME=FILE.npy ... "
    "--output-dir DIR [--threads N] [--cuda [DEVICE]]";

Options ParseArgs(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      printf("%s\n", kUsage);
      printf(
          "Runs an onnxq-quantized ONNX model with onnxq's custom ops registered; writes each "
          "output to DIR/<name>.npy.\n");
      exit(0);
    }
    std::string value;
    const size_t eq = arg.find('=');
    bool inline_value = false;
    if (arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      inline_value = true;
    }
    auto next = [&]() -> std::string {
      if (inline_value) return value;
      if (i + 1 >= argc) throw Error(arg + " needs a value; " + kUsage, kUsageError);
      return argv[++i];
    };
    if (arg == "--model") {
      o.model = next();
    } else if (arg == "--ops") {
      o.ops = next();
    } else if (arg == "--output-dir") {
      o.output_dir = next();
    } else if (arg == "--input") {
      const std::string spec = next();
      const size_t sep = spec.find('=');
      if (sep == std::string::npos || sep == 0 || sep + 1 == spec.size())
        throw Error("--input expects NAME=FILE.npy, got '" + spec + "'", kUsageError);
      o.inputs.emplace_back(spec.substr(0, sep), spec.substr(sep + 1));
    } else if (arg == "--threads") {
      const std::string n = next();
      char* end = nullptr;
      const long t = strtol(n.c_str(), &end, 10);
      if (n.empty() || *end || t < 0 || t > 1024)
        throw Error("--threads expects a count, got '" + n + "'", kUsageError);
      o.threads = static_cast<int>(t);
    } else if (arg == "--cuda") {
      std::string n = "0";
      if (inline_value) {
        n = value;
      } else if (i + 1 < argc && argv[i + 1][0] >= '0' && argv[i + 1][0] <= '9') {
        n = argv[++i];
      }
      char* end = nullptr;
      const long d = strtol(n.c_str(), &end, 10);
      if (n.empty() || *end || d < 0 || d > 1024)
        throw Error("--cuda expects a device number, got '" + n + "'", kUsageError);
      o.cuda_device = static_cast<int>(d);
    } else {
      throw Error("unknown argument '" + std::string(argv[i]) + "'; " + kUsage, kUsageError);
    }
  }
  if (o.model.empty()) throw Error(std::string("--model is required; ") + kUsage, kUsageError);
  if (o.ops.empty()) throw Error(std::string("--ops is required; ") + kUsage, kUsageError);
  if (o.output_dir.empty())
    throw Error(std::string("--output-dir is required; ") + kUsage, kUsageError);
  return o;
}

// The CUDA execution provider on `device`; a clear error where this onnxruntime has none.
void AppendCuda(OrtSessionOptions* so, int device) {
  OrtCUDAProviderOptionsV2* cuda = nullptr;
  auto fail = [](OrtStatus* st, const std::string& what) {
    std::string msg = g_ort->GetErrorMessage(st);
    g_ort->ReleaseStatus(st);
    throw Error("--cuda: " + what + ": " + OneLine(msg) +
                " (it needs an onnxruntime built with CUDA, such as onnxruntime-gpu's library)");
  };
  if (OrtStatus* st = g_ort->CreateCUDAProviderOptions(&cuda))
    fail(st, "this onnxruntime has no CUDA execution provider");
  std::unique_ptr<OrtCUDAProviderOptionsV2, void (*)(OrtCUDAProviderOptionsV2*)> hold(
      cuda, [](OrtCUDAProviderOptionsV2* p) { g_ort->ReleaseCUDAProviderOptions(p); });
  const std::string id = std::to_string(device);
  const char* keys[] = {"device_id"};
  const char* values[] = {id.c_str()};
  if (OrtStatus* st = g_ort->UpdateCUDAProviderOptions(cuda, keys, values, 1))
    fail(st, "bad CUDA device " + id);
  if (OrtStatus* st = g_ort->SessionOptionsAppendExecutionProvider_CUDA_V2(so, cuda))
    fail(st, "the CUDA execution provider cannot be used");
}

void Run(const Options& o) {
  if (!IsRegularFile(o.model)) throw Error("model not found: " + o.model);
  if (!IsRegularFile(o.ops)) throw Error("custom-op library not found: " + o.ops);

  const OrtApiBase* base = OrtGetApiBase();
  g_ort = base->GetApi(ORT_API_VERSION);
  if (!g_ort)
    throw Error(std::string("the onnxruntime library (") + base->GetVersionString() +
                ") does not provide C API version " + std::to_string(ORT_API_VERSION) +
                " that onnxq_host was built against; use a newer onnxruntime");

  Ptr<OrtEnv> env(g_ort->ReleaseEnv);
  Check(g_ort->CreateEnv(ORT_LOGGING_LEVEL_ERROR, "onnxq_host", env.out()), "onnxruntime");
  Ptr<OrtSessionOptions> so(g_ort->ReleaseSessionOptions);
  Check(g_ort->CreateSessionOptions(so.out()), "onnxruntime");
  if (o.threads) Check(g_ort->SetIntraOpNumThreads(so.get(), o.threads), "--threads");
  if (o.cuda_device >= 0) AppendCuda(so.get(), o.cuda_device);
  Check(g_ort->RegisterCustomOpsLibrary_V2(so.get(), o.ops.c_str()),
        "cannot register the custom-op library " + o.ops);

  Ptr<OrtSession> session(g_ort->ReleaseSession);
  Check(g_ort->CreateSession(env.get(), o.model.c_str(), so.get(), session.out()),
        "cannot load the model " + o.model);

  OrtAllocator* alloc = nullptr;
  Check(g_ort->GetAllocatorWithDefaultOptions(&alloc), "onnxruntime");
  auto take_name = [&](char* raw) {
    std::string s(raw);
    if (OrtStatus* st = g_ort->AllocatorFree(alloc, raw)) g_ort->ReleaseStatus(st);
    return s;
  };

  // The model's inputs, checked against the files before anything is read into a tensor.
  size_t n_in = 0, n_out = 0;
  Check(g_ort->SessionGetInputCount(session.get(), &n_in), "onnxruntime");
  Check(g_ort->SessionGetOutputCount(session.get(), &n_out), "onnxruntime");
  std::vector<std::string> in_names(n_in), out_names(n_out);
  std::vector<TensorDesc> in_desc(n_in);
  for (size_t i = 0; i < n_in; ++i) {
    char* raw = nullptr;
    Check(g_ort->SessionGetInputName(session.get(), i, alloc, &raw), "onnxruntime");
    in_names[i] = take_name(raw);
    Ptr<OrtTypeInfo> info(g_ort->ReleaseTypeInfo);
    Check(g_ort->SessionGetInputTypeInfo(session.get(), i, info.out()), "onnxruntime");
    in_desc[i] = DescribeTypeInfo(info.get(), "input '" + in_names[i] + "'");
  }
  for (size_t i = 0; i < n_out; ++i) {
    char* raw = nullptr;
    Check(g_ort->SessionGetOutputName(session.get(), i, alloc, &raw), "onnxruntime");
    out_names[i] = take_name(raw);
  }
  std::string known;
  for (const std::string& n : in_names) known += (known.empty() ? "" : ", ") + n;

  for (size_t a = 0; a < o.inputs.size(); ++a)
    for (size_t b = 0; b < a; ++b)
      if (o.inputs[a].first == o.inputs[b].first)
        throw Error("input '" + o.inputs[a].first + "' is given twice");
  std::vector<const std::pair<std::string, std::string>*> given(n_in, nullptr);
  for (const auto& in : o.inputs) {
    size_t k = 0;
    while (k < n_in && in_names[k] != in.first) ++k;
    if (k == n_in)
      throw Error("the model has no input '" + in.first + "' (its inputs: " + known + ")");
    given[k] = &in;
  }
  for (size_t k = 0; k < n_in; ++k)
    if (!given[k])
      throw Error("missing --input " + in_names[k] + "=FILE.npy (the model's inputs: " + known +
                  ")");

  std::vector<Ptr<OrtValue>> values;
  values.reserve(n_in);
  for (size_t k = 0; k < n_in; ++k) {
    const std::string& name = in_names[k];
    const std::string& path = given[k]->second;
    const std::string where = "input '" + name + "' (" + path + ")";
    File f(fopen(path.c_str(), "rb"));
    if (!f.f) throw Error(where + ": cannot open: " + strerror(errno));
    const NpyHeader h = ParseNpyHeader(f.f, where);
    const TensorDesc& want = in_desc[k];
    bool shape_ok = h.shape.size() == want.shape.size();
    for (size_t d = 0; shape_ok && d < h.shape.size(); ++d)
      shape_ok = want.shape[d] < 0 || want.shape[d] == h.shape[d];
    if (h.type->onnx != want.onnx_type || !shape_ok)
      throw Error(where + ": the model expects " + TypeName(want) + " " +
                  ShapeString(want.shape) + ", the file holds " + h.type->name + " " +
                  ShapeString(h.shape));

    values.emplace_back(g_ort->ReleaseValue);
    Check(g_ort->CreateTensorAsOrtValue(alloc, h.shape.data(), h.shape.size(), h.type->onnx,
                                        values.back().out()),
          where);
    void* data = nullptr;
    Check(g_ort->GetTensorMutableData(values.back().get(), &data), where);
    const size_t bytes = ElementCount(h.shape) * h.type->size;
    if (fseek(f.f, static_cast<long>(h.data_offset), SEEK_SET) != 0 ||
        (bytes && fread(data, 1, bytes, f.f) != bytes))
      throw Error(where + ": truncated .npy data (expected " + std::to_string(bytes) + " bytes)");
  }

  std::vector<const char*> in_ptrs, out_ptrs;
  std::vector<const OrtValue*> in_values;
  for (size_t k = 0; k < n_in; ++k) {
    in_ptrs.push_back(in_names[k].c_str());
    in_values.push_back(values[k].get());
  }
  for (const std::string& n : out_names) out_ptrs.push_back(n.c_str());
  std::vector<OrtValue*> outputs(n_out, nullptr);
  struct ReleaseAll {
    std::vector<OrtValue*>& v;
    ~ReleaseAll() {
      for (OrtValue* p : v)
        if (p) g_ort->ReleaseValue(p);
    }
  } release_outputs{outputs};
  Check(g_ort->Run(session.get(), nullptr, in_ptrs.data(), in_values.data(), n_in,
                   out_ptrs.data(), n_out, outputs.data()),
        "running the model failed");

  if (!IsDirectory(o.output_dir) && mkdir(o.output_dir.c_str(), 0777) != 0 && errno != EEXIST)
    throw Error("cannot create the output directory " + o.output_dir + ": " + strerror(errno));
  std::vector<std::string> files;
  for (size_t k = 0; k < n_out; ++k) {
    const std::string what = "output '" + out_names[k] + "'";
    Ptr<OrtTypeInfo> info(g_ort->ReleaseTypeInfo);
    Check(g_ort->GetTypeInfo(outputs[k], info.out()), what);
    const TensorDesc d = DescribeTypeInfo(info.get(), what);
    if (!d.type) throw Error(what + " has type " + TypeName(d) + ", which .npy cannot hold");
    const void* data = nullptr;
    if (ElementCount(d.shape))
      Check(g_ort->GetTensorMutableData(outputs[k], const_cast<void**>(&data)), what);
    std::string file = SafeFileName(out_names[k]) + ".npy";
    for (const std::string& seen : files)
      if (seen == file) throw Error(what + " and another output both map to the file " + file);
    files.push_back(file);
    WriteNpy(o.output_dir + "/" + file, *d.type, d.shape, data);
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Run(ParseArgs(argc, argv));
    return 0;
  } catch (const Error& e) {
    fprintf(stderr, "onnxq_host: error: %s\n", OneLine(e.what()).c_str());
    return e.status;
  } catch (const std::exception& e) {
    fprintf(stderr, "onnxq_host: error: %s\n", OneLine(e.what()).c_str());
    return kRunError;
  } catch (...) {
    fprintf(stderr, "onnxq_host: error: unexpected failure\n");
    return kRunError;
  }
}
