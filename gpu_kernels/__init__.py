"""kvcheck.gpu_kernels."""
