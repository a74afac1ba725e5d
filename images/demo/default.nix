# The demo image: a shell, coreutils, and Python with pytest.
{pkgs}: {
  contents = [
    pkgs.bashInteractive
    pkgs.coreutils
    (pkgs.python3.withPackages (ps: [ps.pytest]))
  ];
}
