# The same demo image for users with Nix: busybox from the pinned nixpkgs, streamed as a
# docker-archive. The repository's flake does not wire it (its `packages.image-demo` is
# images/demo at the root); a flake of your own calls it with its nixpkgs and
# nix/lockset.nix. cibox adds nothing at build time: the lockset labels are computed by
# nix/lockset.nix over the manifest's lock list.
{
  pkgs,
  lockset,
}:
pkgs.dockerTools.streamLayeredImage {
  name = "cibox-demo";
  tag = "nix";
  created = "1970-01-01T00:00:01Z";
  contents = [pkgs.busybox];
  config = {
    Env = ["PATH=/bin"];
    Cmd = ["/bin/sh"];
    Labels = {
      "org.cibox.lockset" = lockset.digest;
      "org.cibox.lockset.files" = lockset.text;
    };
  };
}
