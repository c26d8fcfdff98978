"""vattn's Hopper (sm_90a) main kernels: CUDA C++ on wgmma with a producer warpgroup, built with nvcc at first
use (build.py), behind vattn's Backend dispatch when VATTN_HOPPER=1 (backend.py: the default kernel)."""
