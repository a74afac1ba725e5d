# A CI image as a docker-archive stream: pinned contents, a fixed creation time, and the
# lockset of its lock files in its labels (docs/interface.md §5), so the image ID is a
# function of the locks and `cibox image verify` can prove it.
#
# `recipe` comes from images/<name>/default.nix: { contents; env ? []; }.
# The lock list is the same one the manifest names: flake.lock and the image's folder.
{
  pkgs,
  lockset,
  name,
  root,
  recipe,
}: let
  locks = lockset {
    inherit root;
    locks = ["flake.lock" "images/${name}/*"];
  };
in
  pkgs.dockerTools.streamLayeredImage {
    name = "cibox-${name}";
    tag = "lockset-${builtins.substring 7 12 locks.digest}";
    created = "1970-01-01T00:00:01Z";
    inherit (recipe) contents;
    # What cibox's containers expect: a writable /work (the source is copied there as
    # the invoking user) and a /tmp for HOME.
    extraCommands = ''
      mkdir -p -m 1777 tmp work
      mkdir -p src reports
    '';
    config = {
      Env = ["PATH=/bin:/usr/bin" "LANG=C.UTF-8"] ++ (recipe.env or []);
      Cmd = ["/bin/sh"];
      Labels = {
        "org.cibox.lockset" = locks.digest;
        "org.cibox.lockset.files" = locks.text;
      };
    };
  }
