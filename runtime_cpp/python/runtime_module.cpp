// aotc._runtime: the pybind11 front end of aotc_runtime. The only file of runtime_cpp/ that knows Python.
//
// Session(path, num_runners=1, device_index=-1, verify_hashes=True); run(list[np.ndarray]) -> list[np.ndarray];
// compare(actual, expected, atol, rtol) -> dict, the C++ side of the parity rule (aotc::compare).
// Inputs are borrowed without a copy when their strides are positive multiples of the itemsize (a
// non-contiguous view is then made contiguous by Session::run); outputs are returned without a copy,
// each ndarray owning its at::Tensor. bfloat16 has no NumPy dtype: such outputs come back as float32
// (exact). Every aotc::Error surfaces as _runtime.Error(kind, message); aotc.runtime maps `kind` to
// aotc's error classes. The GIL is released while a package opens and while the model runs, so calls
// from several Python threads run concurrently. No torch Python module is involved.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#include "aotc/runtime.h"

namespace py = pybind11;

namespace {

const char* kind_name(aotc::Error::Kind kind) {
  switch (kind) {
    case aotc::Error::Kind::InvalidInput: return "invalid_input";
    case aotc::Error::Kind::PackageRefused: return "package_refused";
    case aotc::Error::Kind::NotFound: return "not_found";
    case aotc::Error::Kind::Internal: return "internal";
  }
  return "internal";
}

at::ScalarType scalar_type_of(const py::dtype& dt) {
  const char kind = dt.kind();
  const auto size = dt.itemsize();
  if (kind == 'b' && size == 1) return at::kBool;
  if (kind == 'u' && size == 1) return at::kByte;
  if (kind == 'i') {
    switch (size) {
      case 1: return at::kChar;
      case 2: return at::kShort;
      case 4: return at::kInt;
      case 8: return at::kLong;
    }
  }
  if (kind == 'f') {
    switch (size) {
      case 2: return at::kHalf;
      case 4: return at::kFloat;
      case 8: return at::kDouble;
    }
  }
  throw aotc::Error(aotc::Error::Kind::InvalidInput,
                    "numpy dtype '" + std::string(py::str(dt)) +
                        "' is not supported; use bool, uint8, int8-64 or float16/32/64");
}

py::dtype numpy_dtype(at::ScalarType t) {
  switch (t) {
    case at::kBool: return py::dtype("bool");
    case at::kByte: return py::dtype("uint8");
    case at::kChar: return py::dtype("int8");
    case at::kShort: return py::dtype("int16");
    case at::kInt: return py::dtype("int32");
    case at::kLong: return py::dtype("int64");
    case at::kHalf: return py::dtype("float16");
    case at::kFloat: return py::dtype("float32");
    case at::kDouble: return py::dtype("float64");
    default:
      throw aotc::Error(aotc::Error::Kind::Internal,
                        std::string("output dtype ") + c10::toString(t) + " has no numpy equivalent");
  }
}

// Wraps `arr` as a tensor over the same memory when the layout allows, else over a C-ordered copy kept
// alive in `keep`. Either way the tensor borrows memory that `keep` (or the caller's list) owns.
at::Tensor to_tensor(py::array arr, size_t index, std::vector<py::array>& keep) {
  if (!py::isinstance<py::array>(arr)) {
    throw aotc::Error(aotc::Error::Kind::InvalidInput, "input " + std::to_string(index) + " is not a numpy array");
  }
  const bool native = arr.dtype().byteorder() != '>';
  const auto itemsize = arr.itemsize();
  bool strides_ok = native && reinterpret_cast<uintptr_t>(arr.data()) % itemsize == 0;
  for (py::ssize_t d = 0; d < arr.ndim() && strides_ok; ++d) {
    strides_ok = arr.strides(d) >= 0 && arr.strides(d) % itemsize == 0;
  }
  if (!strides_ok) {
    arr = py::array::ensure(arr, py::array::c_style | py::array::forcecast);
    if (!arr) throw py::error_already_set();
    if (arr.dtype().byteorder() == '>') arr = arr.attr("astype")(arr.dtype().attr("newbyteorder")("="));
  }
  keep.push_back(arr);
  const at::ScalarType type = scalar_type_of(arr.dtype());
  std::vector<int64_t> sizes(arr.ndim()), strides(arr.ndim());
  for (py::ssize_t d = 0; d < arr.ndim(); ++d) {
    sizes[d] = arr.shape(d);
    strides[d] = arr.strides(d) / itemsize;
  }
  return at::from_blob(const_cast<void*>(arr.data()), sizes, strides, at::TensorOptions().dtype(type));
}

py::array to_numpy(at::Tensor t) {
  t = t.detach();
  if (!t.device().is_cpu()) t = t.cpu();
  if (t.scalar_type() == at::kBFloat16) t = t.to(at::kFloat);
  if (!t.is_contiguous()) t = t.contiguous();
  auto* owner = new at::Tensor(t);
  py::capsule base(owner, [](void* p) { delete static_cast<at::Tensor*>(p); });
  std::vector<py::ssize_t> shape(t.sizes().begin(), t.sizes().end());
  std::vector<py::ssize_t> strides;
  for (int64_t s : t.strides()) strides.push_back(s * static_cast<py::ssize_t>(t.element_size()));
  return py::array(numpy_dtype(t.scalar_type()), shape, strides, t.data_ptr(), base);
}

std::vector<at::Tensor> to_tensors(const py::list& arrays, std::vector<py::array>& keep) {
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < arrays.size(); ++i) {
    py::object item = arrays[i];
    if (!py::isinstance<py::array>(item)) {
      throw aotc::Error(aotc::Error::Kind::InvalidInput,
                        "input " + std::to_string(i) + " is a " + std::string(py::str(py::type::of(item).attr("__name__"))) +
                            ", expected a numpy.ndarray");
    }
    out.push_back(to_tensor(item.cast<py::array>(), i, keep));
  }
  return out;
}

py::list to_list(const std::vector<at::Tensor>& tensors) {
  py::list out;
  for (const auto& t : tensors) out.append(to_numpy(t));
  return out;
}

class PySession {
 public:
  PySession(const std::string& path, size_t num_runners, int device_index, bool verify_hashes) {
    aotc::SessionOptions o;
    o.num_runners = num_runners;
    o.device_index = device_index;
    o.verify_hashes = verify_hashes;
    py::gil_scoped_release nogil;
    session_ = aotc::Session::open(path, o);
  }

  py::list run(const py::list& arrays) const {
    std::vector<py::array> keep;
    std::vector<at::Tensor> inputs = to_tensors(arrays, keep);
    std::vector<at::Tensor> outputs;
    {
      py::gil_scoped_release nogil;
      outputs = session_->run(inputs);
    }
    return to_list(outputs);
  }

  void validate(const py::list& arrays) const {
    std::vector<py::array> keep;
    session_->validate(to_tensors(arrays, keep));
  }

  std::string graph_for_batch(int64_t batch, int64_t length) const { return session_->graph_for_batch(batch, length); }
  std::vector<int64_t> cuda_graph_buckets() const { return session_->cuda_graph_buckets(); }
  py::list load_samples() const {
    py::list out;
    for (const auto& [ins, outs] : session_->load_samples()) out.append(py::make_tuple(to_list(ins), to_list(outs)));
    return out;
  }

  std::string manifest_json() const { return session_->manifest().raw_json; }
  std::string path() const { return session_->path(); }

 private:
  std::unique_ptr<aotc::Session> session_;
};

}  // namespace

PYBIND11_MODULE(_runtime, m) {
  m.doc() = "aotc C++ runtime (aotc_runtime) bound for Python; use aotc.runtime, which maps errors";
  static py::exception<std::exception> error(m, "Error");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const aotc::Error& e) {
      PyErr_SetObject(error.ptr(), py::make_tuple(kind_name(e.kind()), e.what()).ptr());
    } catch (const c10::Error& e) {
      std::string msg = e.msg();
      PyErr_SetObject(error.ptr(), py::make_tuple("internal", msg.substr(0, msg.find('\n'))).ptr());
    }
  });
  m.attr("LIBTORCH_VERSION") = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) +
                                "." + std::to_string(TORCH_VERSION_PATCH);

  py::class_<PySession>(m, "Session")
      .def(py::init<const std::string&, size_t, int, bool>(), py::arg("path"), py::arg("num_runners") = 1,
           py::arg("device_index") = -1, py::arg("verify_hashes") = true)
      .def("run", &PySession::run, py::arg("inputs"), "Validate and run; list of ndarrays in, list out.")
      .def("validate", &PySession::validate, py::arg("inputs"), "The checks run() does, without running.")
      .def("load_samples", &PySession::load_samples, "Stored samples: [(inputs, eager_outputs), ...].")
      .def("graph_for_batch", &PySession::graph_for_batch, py::arg("batch"), py::arg("length") = -1,
           "The package graph a call of this batch (and sequence length) runs: a static graph's name, else its "
           "sequence bucket's main graph, else 'model'.")
      .def("cuda_graph_buckets", &PySession::cuda_graph_buckets,
           "Batch sizes replayed as captured CUDA graphs; empty for a CPU package or with graphs off.")
      .def_property_readonly("manifest_json", &PySession::manifest_json)
      .def_property_readonly("path", &PySession::path);

  m.def(
      "compare",
      [](py::array actual, py::array expected, double atol, double rtol) {
        std::vector<py::array> keep;
        aotc::Comparison c = aotc::compare(to_tensor(actual, 0, keep), to_tensor(expected, 1, keep), atol, rtol);
        py::dict out;
        out["ok"] = c.ok;
        out["max_abs"] = c.max_abs;
        out["max_rel"] = c.max_rel;
        out["mismatched"] = c.mismatched;
        out["mismatch"] = c.mismatch;
        return out;
      },
      py::arg("actual"), py::arg("expected"), py::arg("atol"), py::arg("rtol"),
      "aotc::compare, the parity rule aotc-run checks with: {ok, max_abs, max_rel, mismatched, mismatch}.");
}
