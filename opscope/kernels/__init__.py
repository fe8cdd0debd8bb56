"""The bundled reference kernels seen from opscope: which op each replaces, the listing, the benchmark."""
