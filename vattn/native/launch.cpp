// vattn's kernel launches for calls of one signature, as CPython types (vattn/native/launch.py builds them):
// Launch, the Hopper main kernel's and, once its binding launches natively, the Triton main kernel's (vattn.api's
// Shortcut); PointerLaunch, the CUDA reduce's and, once bound, vattn's Triton kernels' (vattn/launcher.py).
//
// Why C++: an eager vattn.attention call spent ~9 us of an H200 host's time building and comparing its signature
// in Python (36 tensor attributes) and ~5 more filling ctypes parameters, around a ~6 us cuLaunchKernel. Here the
// same checks read the tensors' metadata directly (~0.1 us for all nine) and the parameters are one buffer.
//
// Launch(launch_fn, stream_fn, function, grid, threads, smem, examples, scale, params, pdl)
//   launch_fn: cuLaunchKernelEx's address; stream_fn: a callable returning the current raw stream;
//   examples: the signature's nine arguments (q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q,
//   k_descale, v_descale, out; a descale may be None): their dims, sizes, strides (not the descales'), dtypes
//   and devices are what a call must match; scale: the softmax scale the kernel takes;
//   params: the kernel's parameters in order, each ("u64" | "i32" | "f32", value), ("ptr", i[, align]) (argument
//   i's data pointer, 0 for None; a call whose pointer is not a multiple of align bytes is not this signature),
//   ("stride", i, d) or ("kmap",) / ("vmap",) (the caches' TMA maps, by value);
//   pdl: launch as a programmatic dependent of the stream's previous kernel (the kernel waits for it itself).
// launch(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale, softmax_scale, out)
//   -> 1 launched; 0 not this signature (nothing launched); -1 no TMA maps for these caches yet (add_maps them).
//   softmax_scale None stands for 1/sqrt(head_dim), as in vattn.attention. A failed launch raises RuntimeError.
// add_maps(k_ptr, v_ptr, k_map, v_map): the 128-byte CUtensorMaps of one pair of caches.
//
// PointerLaunch(name, launch_fn, stream_fn, function, grid, threads, smem, params, pdl, keep): a kernel whose
// parameters are fixed but for some tensors' data pointers, which each call passes (the reduce: cu_seqlens_q and
// out, the rest bound once per signature, which the caller has checked). params: ("u64" | "i32" | "f32", value) or
// ("ptr", i[, align]): the call's argument i's data pointer, a multiple of align bytes; keep: what the fixed
// values address, kept alive with the launch. launch(*tensors) -> None; a misaligned pointer raises ValueError
// (nothing launched), a failed launch RuntimeError.
#include <Python.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace {

constexpr int kArgs = 10;  // the launch's arguments; the softmax scale is the ninth
constexpr int kScaleArg = 8;
constexpr size_t kMapsKept = 512;  // map pairs kept (one per layer's caches in a server), as build.MAPS_KEPT

// cuLaunchKernelEx's arguments as cuda.h (CUDA >= 12.0) lays them out, declared here since the extension builds
// against torch's headers alone: CUlaunchAttribute (a 4-byte id, then a 64-byte union at offset 8) and
// CUlaunchConfig.
struct LaunchAttribute {
  int id;
  union alignas(8) {
    char bytes[64];
    int value;
  } v;
};
struct LaunchConfig {
  unsigned grid[3], block[3], smem;
  void* stream;
  LaunchAttribute* attrs;
  unsigned num_attrs;
};
static_assert(sizeof(LaunchAttribute) == 72 && sizeof(LaunchConfig) == 56, "cuda.h's launch config layout");
constexpr int kProgrammaticStreamSerialization = 6;  // CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
using LaunchFn = int (*)(const LaunchConfig*, void*, void**, void**);

struct Meta {  // one tensor argument of the signature
  bool none = true;
  bool check_strides = true;
  std::vector<int64_t> sizes, strides;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::Device device{c10::kCPU};
};

enum Kind { kFixed, kPtr, kStride, kKMap, kVMap };
struct Param {
  Kind kind;
  int arg = 0, dim = 0;
  uint64_t align = 1;  // kPtr: the address's
};

struct alignas(64) MapPair {
  unsigned char k[128], v[128];
};

// What a launch of either type enqueues with: the driver's entry, the stream getter, the kernel and its config.
struct Enqueue {
  LaunchFn launch = nullptr;
  PyObject* stream_fn = nullptr;  // owned once set
  void* function = nullptr;
  LaunchConfig config{};
  LaunchAttribute pdl{};  // config.attrs points here: an Enqueue stays where it was made
  ~Enqueue() { Py_XDECREF(stream_fn); }
};

bool set_up(Enqueue& e, PyObject* launch_fn, PyObject* stream_fn, PyObject* function, PyObject* grid,
            unsigned threads, unsigned smem, int pdl) {
  e.launch = reinterpret_cast<LaunchFn>(PyLong_AsVoidPtr(launch_fn));
  e.function = PyLong_AsVoidPtr(function);
  if (PyErr_Occurred()) return false;
  LaunchConfig& c = e.config;
  if (!PyArg_ParseTuple(grid, "III", &c.grid[0], &c.grid[1], &c.grid[2])) return false;
  c.block[0] = threads;
  c.block[1] = c.block[2] = 1;
  c.smem = smem;
  e.pdl.id = kProgrammaticStreamSerialization;
  e.pdl.v.value = 1;
  c.attrs = &e.pdl;
  c.num_attrs = pdl ? 1 : 0;
  Py_INCREF(stream_fn);
  e.stream_fn = stream_fn;
  return true;
}

// The kernel on the current stream with these parameter slots; false with an exception set if it fails.
bool enqueue(Enqueue& e, void** slots) {
  PyObject* stream = PyObject_CallNoArgs(e.stream_fn);
  if (!stream) return false;
  e.config.stream = PyLong_AsVoidPtr(stream);
  Py_DECREF(stream);
  if (PyErr_Occurred()) return false;
  int rc = e.launch(&e.config, e.function, slots, nullptr);
  if (rc != 0) PyErr_Format(PyExc_RuntimeError, "cuLaunchKernelEx failed: CUresult %d", rc);
  return rc == 0;
}

// A fixed parameter, ("u64" | "i32" | "f32", a), into its 8-byte slot (i32 and f32 in the low bytes); false: kind
// is not a fixed one.
bool fixed_value(const char* kind, PyObject* a, uint64_t& v) {
  if (!a) return false;
  if (!std::strcmp(kind, "u64")) {
    v = PyLong_AsUnsignedLongLongMask(a);
  } else if (!std::strcmp(kind, "i32")) {
    int32_t x = static_cast<int32_t>(PyLong_AsLong(a));
    std::memcpy(&v, &x, sizeof x);
  } else if (!std::strcmp(kind, "f32")) {
    float x = static_cast<float>(PyFloat_AsDouble(a));
    std::memcpy(&v, &x, sizeof x);
  } else {
    return false;
  }
  return true;
}

struct State {
  Enqueue enqueue;
  Meta meta[kArgs];
  double scale = 0, default_scale = 0;
  std::vector<Param> params;
  std::vector<uint64_t> values;  // one 8-byte slot a parameter (i32 and f32 in its low bytes)
  std::vector<void*> slots;      // kernelParams: a slot's address, or a map's
  std::map<std::pair<uint64_t, uint64_t>, std::unique_ptr<MapPair>> maps;
};

struct LaunchObject {
  PyObject_HEAD State* state;
};

int arg_index(int i) { return i < kScaleArg ? i : i + 1; }  // tensor i's position among the call's arguments

bool record(Meta& m, PyObject* obj, bool check_strides) {
  m.check_strides = check_strides;
  if (obj == Py_None) return true;
  if (!THPVariable_Check(obj)) {
    PyErr_SetString(PyExc_TypeError, "Launch: examples must be tensors or None");
    return false;
  }
  const at::Tensor& t = THPVariable_Unpack(obj);
  m.none = false;
  m.sizes.assign(t.sizes().begin(), t.sizes().end());
  m.strides.assign(t.strides().begin(), t.strides().end());
  m.dtype = t.scalar_type();
  m.device = t.device();
  return true;
}

bool matches(const Meta& m, PyObject* obj) {
  if (obj == Py_None) return m.none;
  if (m.none || !THPVariable_Check(obj)) return false;
  const at::Tensor& t = THPVariable_Unpack(obj);
  if (t.scalar_type() != m.dtype || t.device() != m.device) return false;
  auto sizes = t.sizes();
  if (sizes.size() != m.sizes.size() || !std::equal(sizes.begin(), sizes.end(), m.sizes.begin())) return false;
  if (!m.check_strides) return true;
  auto strides = t.strides();
  return std::equal(strides.begin(), strides.end(), m.strides.begin());
}

uint64_t data_ptr(PyObject* obj) {
  return obj == Py_None ? 0 : reinterpret_cast<uint64_t>(THPVariable_Unpack(obj).data_ptr());
}

int init(LaunchObject* self, PyObject* args, PyObject*) {
  PyObject *launch_fn, *stream_fn, *function, *grid, *examples, *params;
  unsigned threads, smem;
  double scale;
  int pdl;
  if (!PyArg_ParseTuple(args, "OOOOIIOdOp", &launch_fn, &stream_fn, &function, &grid, &threads, &smem, &examples,
                        &scale, &params, &pdl))
    return -1;
  auto st = std::make_unique<State>();
  if (!set_up(st->enqueue, launch_fn, stream_fn, function, grid, threads, smem, pdl)) return -1;
  st->scale = scale;
  if (!PyTuple_Check(examples) || PyTuple_GET_SIZE(examples) != kArgs - 1) {
    PyErr_SetString(PyExc_TypeError, "Launch: examples must be a tuple of the nine tensor arguments");
    return -1;
  }
  for (int i = 0; i < kArgs - 1; ++i) {  // the descales (6, 7) are [1]: their strides are never read
    if (!record(st->meta[i], PyTuple_GET_ITEM(examples, i), i != 6 && i != 7)) return -1;
  }
  if (st->meta[0].none || st->meta[0].sizes.size() != 3) {
    PyErr_SetString(PyExc_ValueError, "Launch: q must be a [T, Hq, D] tensor");
    return -1;
  }
  st->default_scale = 1.0 / std::sqrt(static_cast<double>(st->meta[0].sizes[2]));
  PyObject* seq = PySequence_Fast(params, "Launch: params must be a sequence");
  if (!seq) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  st->params.resize(n);
  st->values.assign(n, 0);
  st->slots.assign(n, nullptr);
  for (Py_ssize_t j = 0; j < n; ++j) {
    PyObject* p = PySequence_Fast_GET_ITEM(seq, j);
    const char* kind = nullptr;
    PyObject *a = nullptr, *b = nullptr;
    if (!PyArg_ParseTuple(p, "s|OO", &kind, &a, &b)) {
      Py_DECREF(seq);
      return -1;
    }
    Param& q = st->params[j];
    uint64_t& v = st->values[j];
    st->slots[j] = &v;
    if (fixed_value(kind, a, v)) {
      q.kind = kFixed;
    } else if (!std::strcmp(kind, "ptr") && a) {
      q.kind = kPtr;
      q.arg = static_cast<int>(PyLong_AsLong(a));
      if (b) q.align = PyLong_AsUnsignedLongLong(b);
      if (!PyErr_Occurred() && (q.align == 0 || (q.align & (q.align - 1))))
        PyErr_Format(PyExc_ValueError, "Launch: params[%zd]: aligned to %llu bytes; allowed: a power of two", j,
                     static_cast<unsigned long long>(q.align));
    } else if (!std::strcmp(kind, "stride") && a && b) {
      q.kind = kStride;
      q.arg = static_cast<int>(PyLong_AsLong(a));
      q.dim = static_cast<int>(PyLong_AsLong(b));
    } else if (!std::strcmp(kind, "kmap") || !std::strcmp(kind, "vmap")) {
      q.kind = kind[0] == 'k' ? kKMap : kVMap;
    } else {
      PyErr_Format(PyExc_ValueError, "Launch: params[%zd]: kind %s with its operands; allowed: u64, i32, f32, "
                   "ptr, stride, kmap, vmap", j, kind);
    }
    bool tensor = q.kind == kPtr || q.kind == kStride;
    if (!PyErr_Occurred() && tensor && (q.arg < 0 || q.arg >= kArgs - 1 ||
                                         (q.kind == kStride && (st->meta[q.arg].none || q.dim < 0 ||
                                                                q.dim >= static_cast<int>(st->meta[q.arg].sizes.size())))))
      PyErr_Format(PyExc_ValueError, "Launch: params[%zd] names tensor %d dim %d, which the examples lack", j, q.arg,
                   q.dim);
    if (PyErr_Occurred()) {
      Py_DECREF(seq);
      return -1;
    }
  }
  Py_DECREF(seq);
  delete self->state;
  self->state = st.release();
  return 0;
}

template <class Object>
void dealloc(Object* self) {
  delete self->state;
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

PyObject* launch(LaunchObject* self, PyObject* const* args, Py_ssize_t nargs) {
  State* st = self->state;
  if (!st || nargs != kArgs) {
    PyErr_SetString(PyExc_TypeError, "Launch.launch takes the ten arguments of vattn.attention's call");
    return nullptr;
  }
  for (int i = 0; i < kArgs - 1; ++i)
    if (!matches(st->meta[i], args[arg_index(i)])) return PyLong_FromLong(0);
  PyObject* scale = args[kScaleArg];
  double s = scale == Py_None ? st->default_scale : PyFloat_AsDouble(scale);
  if (s == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    return PyLong_FromLong(0);
  }
  if (s != st->scale) return PyLong_FromLong(0);
  MapPair* maps = nullptr;
  for (size_t j = 0; j < st->params.size(); ++j) {
    const Param& p = st->params[j];
    switch (p.kind) {
      case kFixed:
        break;
      case kPtr:
        st->values[j] = data_ptr(args[arg_index(p.arg)]);
        if (st->values[j] % p.align) return PyLong_FromLong(0);
        break;
      case kStride:
        st->values[j] = static_cast<uint64_t>(THPVariable_Unpack(args[arg_index(p.arg)]).stride(p.dim));
        break;
      case kKMap:
      case kVMap:
        if (!maps) {
          auto it = st->maps.find({data_ptr(args[1]), data_ptr(args[2])});
          if (it == st->maps.end()) return PyLong_FromLong(-1);
          maps = it->second.get();
        }
        st->slots[j] = p.kind == kKMap ? maps->k : maps->v;
        break;
    }
  }
  if (!enqueue(st->enqueue, st->slots.data())) return nullptr;
  return PyLong_FromLong(1);
}

PyObject* add_maps(LaunchObject* self, PyObject* args) {
  unsigned long long k, v;
  Py_buffer kmap, vmap;
  if (!self->state || !PyArg_ParseTuple(args, "KKy*y*", &k, &v, &kmap, &vmap)) return nullptr;
  PyObject* result = nullptr;
  if (kmap.len != 128 || vmap.len != 128) {
    PyErr_SetString(PyExc_ValueError, "Launch.add_maps: a CUtensorMap is 128 bytes");
  } else {
    auto& maps = self->state->maps;
    if (maps.size() >= kMapsKept) maps.clear();
    auto pair = std::make_unique<MapPair>();
    std::memcpy(pair->k, kmap.buf, 128);
    std::memcpy(pair->v, vmap.buf, 128);
    maps[{k, v}] = std::move(pair);
    result = Py_NewRef(Py_None);
  }
  PyBuffer_Release(&kmap);
  PyBuffer_Release(&vmap);
  return result;
}

struct Pointer {  // a parameter a call fills: its slot, the call's argument, the address's alignment
  size_t slot;
  Py_ssize_t arg;
  unsigned long long align;
};

struct PointerState {
  Enqueue enqueue;
  std::string name;             // the kernel's, for errors
  PyObject* keep = nullptr;     // owned once set
  std::vector<uint64_t> values;  // one 8-byte slot a parameter, as State's
  std::vector<void*> slots;
  std::vector<Pointer> pointers;
  ~PointerState() { Py_XDECREF(keep); }
};

struct PointerLaunchObject {
  PyObject_HEAD PointerState* state;
};

int pointer_init(PointerLaunchObject* self, PyObject* args, PyObject*) {
  PyObject *launch_fn, *stream_fn, *function, *grid, *params, *keep;
  const char* name;
  unsigned threads, smem;
  int pdl;
  if (!PyArg_ParseTuple(args, "sOOOOIIOpO", &name, &launch_fn, &stream_fn, &function, &grid, &threads, &smem,
                        &params, &pdl, &keep))
    return -1;
  auto st = std::make_unique<PointerState>();
  st->name = name;
  if (!set_up(st->enqueue, launch_fn, stream_fn, function, grid, threads, smem, pdl)) return -1;
  PyObject* seq = PySequence_Fast(params, "PointerLaunch: params must be a sequence");
  if (!seq) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  st->values.assign(n, 0);
  for (Py_ssize_t j = 0; j < n; ++j) {
    const char* kind = nullptr;
    PyObject *a = nullptr, *b = nullptr;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, j), "s|OO", &kind, &a, &b)) break;
    if (fixed_value(kind, a, st->values[j])) continue;
    if (!std::strcmp(kind, "ptr") && a) {
      Pointer p{static_cast<size_t>(j), PyLong_AsSsize_t(a), b ? PyLong_AsUnsignedLongLong(b) : 1};
      if (!PyErr_Occurred() && (p.arg < 0 || p.align == 0 || (p.align & (p.align - 1))))
        PyErr_Format(PyExc_ValueError, "PointerLaunch: params[%zd]: argument %zd aligned to %llu bytes; allowed: "
                     "an argument index >= 0 and a power of two", j, p.arg, p.align);
      st->pointers.push_back(p);
    } else if (!PyErr_Occurred()) {
      PyErr_Format(PyExc_ValueError, "PointerLaunch: params[%zd]: kind %s with its operands; allowed: u64, i32, "
                   "f32, ptr", j, kind);
    }
    if (PyErr_Occurred()) break;
  }
  Py_DECREF(seq);
  if (PyErr_Occurred()) return -1;
  for (uint64_t& v : st->values) st->slots.push_back(&v);
  Py_INCREF(keep);
  st->keep = keep;
  delete self->state;
  self->state = st.release();
  return 0;
}

PyObject* pointer_launch(PointerLaunchObject* self, PyObject* const* args, Py_ssize_t nargs) {
  PointerState* st = self->state;
  if (!st) {
    PyErr_SetString(PyExc_TypeError, "PointerLaunch: not initialised");
    return nullptr;
  }
  for (const Pointer& p : st->pointers) {
    if (p.arg >= nargs || !THPVariable_Check(args[p.arg]))
      return PyErr_Format(PyExc_TypeError, "%s: argument %zd must be a tensor", st->name.c_str(), p.arg);
    uint64_t address = data_ptr(args[p.arg]);
    if (address % p.align) {  // (PyErr_Format takes no %llx)
      char message[256];
      std::snprintf(message, sizeof message, "%s: argument %zd at 0x%llx; allowed: a %llu-byte aligned address",
                    st->name.c_str(), p.arg, static_cast<unsigned long long>(address), p.align);
      PyErr_SetString(PyExc_ValueError, message);
      return nullptr;
    }
    st->values[p.slot] = address;
  }
  if (!enqueue(st->enqueue, st->slots.data())) return nullptr;
  Py_RETURN_NONE;
}

PyMethodDef pointer_methods[] = {
    {"launch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(pointer_launch)), METH_FASTCALL,
     "launch(*tensors): the kernel with these tensors' data pointers in their parameters"},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject pointer_launch_type = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyMethodDef methods[] = {
    {"launch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(launch)), METH_FASTCALL,
     "launch(q, k_cache, v_cache, block_tables, seq_lens, cu_seqlens_q, k_descale, v_descale, softmax_scale, out) "
     "-> 1 launched, 0 another signature, -1 no TMA maps for these caches"},
    {"add_maps", reinterpret_cast<PyCFunction>(add_maps), METH_VARARGS,
     "add_maps(k_ptr, v_ptr, k_map, v_map): one pair of caches' 128-byte TMA maps"},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject launch_type = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "vattn_native_launch", nullptr, -1, nullptr};

template <class Object, class Init>
int ready(PyTypeObject& type, const char* name, Init init, PyMethodDef* methods) {
  type.tp_name = name;
  type.tp_basicsize = sizeof(Object);
  type.tp_flags = Py_TPFLAGS_DEFAULT;
  type.tp_new = PyType_GenericNew;
  type.tp_init = reinterpret_cast<initproc>(init);
  type.tp_dealloc = reinterpret_cast<destructor>(dealloc<Object>);
  type.tp_methods = methods;
  return PyType_Ready(&type);
}

}  // namespace

PyMODINIT_FUNC PyInit_vattn_native_launch() {
  if (ready<LaunchObject>(launch_type, "vattn_native_launch.Launch", init, methods) < 0 ||
      ready<PointerLaunchObject>(pointer_launch_type, "vattn_native_launch.PointerLaunch", pointer_init,
                                 pointer_methods) < 0)
    return nullptr;
  PyObject* m = PyModule_Create(&module);
  if (!m) return nullptr;
  if (PyModule_AddObjectRef(m, "Launch", reinterpret_cast<PyObject*>(&launch_type)) < 0 ||
      PyModule_AddObjectRef(m, "PointerLaunch", reinterpret_cast<PyObject*>(&pointer_launch_type)) < 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
