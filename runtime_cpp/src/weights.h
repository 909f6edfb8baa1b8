// Static graphs that carry no weights (`aotc export --static-batches` compiles them without) run on the
// main graph's: the tensors the main graph's container holds, lent to theirs without a copy.
#pragma once

#include <string>
#include <unordered_map>

#include <ATen/Tensor.h>

#include "aotc/runtime.h"

namespace torch::inductor {
class AOTIModelPackageLoader;
}

namespace aotc {

// Constant name (the graph's own) -> the main graph's tensor it reads. The lending graph's container keeps
// pointers into this map in some torch versions, so it must outlive that graph's loader.
using LentWeights = std::unordered_map<std::string, at::Tensor>;

// Lends `main`'s weights to static graph `graph`, loaded in `borrower`, where the manifest says it takes
// them (Manifest::borrowed_weights); fills `lent`. Throws Error(PackageRefused) naming the graph and the
// constant when the main graph lacks one it needs or holds it with another dtype, and when a graph the
// manifest says carries its own weights holds none.
void lend_weights(const Manifest& manifest, const std::string& graph, torch::inductor::AOTIModelPackageLoader& main,
                  torch::inductor::AOTIModelPackageLoader& borrower, LentWeights& lent);

}  // namespace aotc
