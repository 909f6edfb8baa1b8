// aotc npy: read and write NumPy .npy files (format 1.0-3.0, little-endian or byte-free dtypes, C or
// Fortran order on read; version 1.0, C order on write). Our own ~150 lines rather than a dependency:
// the format is small and fixed, and cnpy & co. neither map to at::Tensor nor refuse malformed headers
// with a clear reason. Free functions, no state: safe from any thread.
#pragma once

#include <string>

#include <ATen/Tensor.h>

namespace aotc {

// Decodes .npy bytes into a new contiguous CPU tensor. `what` names the source in errors.
// Throws Error(InvalidInput) on a malformed header, an unsupported dtype or truncated data.
at::Tensor npy_decode(const std::string& bytes, const std::string& what);
// Encodes a tensor (any device, any layout) as .npy version 1.0 bytes.
std::string npy_encode(const at::Tensor& tensor);

// File versions. Throw Error(NotFound) when the file cannot be opened, Error(Internal) when it cannot be written.
at::Tensor read_npy(const std::string& path);
void write_npy(const std::string& path, const at::Tensor& tensor);

}  // namespace aotc
