"""aotc's own device kernels (Triton), registered as torch custom ops. Importing a submodule needs triton."""
