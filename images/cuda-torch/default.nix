# A realistic GPU test image: Python with PyTorch built with CUDA support, and the CUDA
# toolkit's nvcc for tests that compile kernels; all from the flake's pinned nixpkgs.
# `pkgs.pkgsCuda` is nixpkgs' variant of the flake's package set with cudaSupport on; it
# keeps the flake's config, whose unfree predicate admits only NVIDIA's CUDA licences.
{pkgs}: let
  cudaPkgs = pkgs.pkgsCuda;
in {
  contents = [
    cudaPkgs.bashInteractive
    cudaPkgs.coreutils
    cudaPkgs.cudaPackages.cuda_nvcc
    (cudaPkgs.python3.withPackages (ps: [ps.torch ps.pytest ps.numpy]))
  ];
  # The NVIDIA container runtime mounts the driver's libraries here.
  env = ["LD_LIBRARY_PATH=/run/opengl-driver/lib:/usr/lib64" "NVIDIA_DRIVER_CAPABILITIES=compute,utility"];
}
