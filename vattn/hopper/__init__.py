"""vattn's Hopper (sm_90a) main kernel: CUDA C++ on wgmma with a producer warpgroup, built at first use
(build.py). A prototype measured against the Triton path; not yet behind vattn's Backend dispatch."""
