"""Bad model file: raises while being imported."""
import no_such_module_for_aotc_tests  # noqa: F401
