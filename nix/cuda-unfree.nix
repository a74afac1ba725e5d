# The unfree packages the cuda-torch image may use: NVIDIA's CUDA redistributables and
# libraries. Everything else must be free.
lib: name:
builtins.elem name [
  "cuda_cccl"
  "cuda_cudart"
  "cuda_cupti"
  "cuda_nvcc"
  "cuda_nvml_dev"
  "cuda_nvrtc"
  "cuda_nvtx"
  "cuda_profiler_api"
  "cudnn"
  "libcublas"
  "libcufft"
  "libcufile"
  "libcurand"
  "libcusolver"
  "libcusparse"
  "libcusparse_lt"
  "libnvjitlink"
  "nccl"
  "cuda-merged"
  "cuda-native-redist"
  "triton"
  "torch"
]
|| lib.hasPrefix "cuda_" name
|| lib.hasPrefix "libcu" name
