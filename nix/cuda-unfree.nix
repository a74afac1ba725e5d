# The unfree packages this flake accepts: those whose every licence is free or one of
# NVIDIA's CUDA family, as nixpkgs names them (its CUDA documentation decides by
# licence, not by package name: cuda_nvcc alone pulls in libnvvm, libnvptxcompiler and
# cuda_cccl under `nvidiaCudaRedist`). Anything else unfree is refused.
#
#   config.allowUnfreePredicate = import ./nix/cuda-unfree.nix;
#
# `meta.license` is one licence or a list of them. The CUDA family by `shortName`:
# lib.licenses.nvidiaCuda and nvidiaCudaRedist ("CUDA EULA"), and the licences of cuDNN,
# cuSPARSELt, cuTENSOR, TensorRT and NVIDIA's math SDKs (`_cuda.lib.licenses` in
# nixpkgs). Builtins only, so it needs no nixpkgs to be read or tested.
pkg: let
  cudaLicences = [
    "CUDA EULA"
    "cuDNN EULA"
    "cuSPARSELt EULA"
    "cuTENSOR EULA"
    "TensorRT EULA"
    "NVIDIA Math SDK SLA"
  ];
  license = (pkg.meta or {}).license or [];
  licences =
    if builtins.isList license
    then license
    else [license];
  accepted = l:
    builtins.isAttrs l
    && ((l.free or false) || builtins.elem (l.shortName or null) cudaLicences);
in
  licences != [] && builtins.all accepted licences
