"""Layer 3: the math. Each op keeps its reference beside its Triton kernels."""
