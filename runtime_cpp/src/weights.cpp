#include "weights.h"

#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

namespace aotc {

void lend_weights(const Manifest& manifest, const std::string& graph, torch::inductor::AOTIModelPackageLoader& main,
                  torch::inductor::AOTIModelPackageLoader& borrower, LentWeights& lent) {
  auto refuse = [&](const std::string& why) { throw Error(Error::Kind::PackageRefused, "graph '" + graph + "' " + why); };
  auto* runner = borrower.get_runner();
  const auto names = runner->getConstantNamesToOriginalFQNs();  // its constant name -> the model's FQN
  if (!manifest.borrowed_weights.count(graph)) {
    // A graph said to carry its own weights must hold them: running one that holds none reads null pointers.
    if (!names.empty() && runner->extract_constants_map(/*use_inactive=*/false).empty())
      refuse("holds no weights, and the manifest does not say it takes 'model''s (static_graphs[].weights)");
    return;
  }
  const auto have = main.get_runner()->extract_constants_map(/*use_inactive=*/false);  // FQN -> tensor
  const auto want_dtypes = runner->getConstantNamesToDtypes();
  for (const auto& [name, fqn] : names) {
    auto it = have.find(fqn);
    if (it == have.end()) refuse("needs weight '" + fqn + "', which graph 'model' does not hold");
    auto dt = want_dtypes.find(name);
    if (dt != want_dtypes.end() && static_cast<int32_t>(it->second.scalar_type()) != dt->second) {
      refuse("needs weight '" + fqn + "' as " + c10::toString(static_cast<c10::ScalarType>(dt->second)) +
             ", graph 'model' holds it as " + c10::toString(it->second.scalar_type()));
    }
    lent.emplace(name, it->second);
  }
  try {
    runner->update_constant_buffer(lent, /*use_inactive=*/false, /*validate_full_updates=*/true, /*user_managed=*/true);
  } catch (const std::exception& e) {
    std::string msg = e.what();
    refuse("could not take graph 'model''s weights: " + msg.substr(0, msg.find('\n')));
  }
}

}  // namespace aotc
