"""vattn's CUDA host code, beneath both kernel paths: the CUDA driver through ctypes, nvcc's cubins in vattn's
cache (cuda.py), and launch.cpp's launches, built at first use (launch.py). The Hopper kernels (vattn.hopper)
and the Triton path's bound launches (vattn.launcher) both launch through them."""
