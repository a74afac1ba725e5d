# A realistic GPU test image: Python with PyTorch built with CUDA support, and the CUDA
# toolkit's nvcc for tests that compile kernels; all from the flake's pinned nixpkgs.
{pkgs}: let
  cudaPkgs = import pkgs.path {
    inherit (pkgs) system;
    config = {
      cudaSupport = true;
      allowUnfreePredicate = p: import ../../nix/cuda-unfree.nix pkgs.lib (pkgs.lib.getName p);
    };
  };
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
