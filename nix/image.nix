# A CI image as a docker-archive stream: pinned contents, a fixed creation time, and the
# lockset of its lock files in its labels (docs/interface.md §5), so the image ID is a
# function of the locks and `cibox image verify --name NAME` can prove it.
#
# `recipe` comes from images/<name>/default.nix: { contents; env ? []; }.
# The lock list is the same one the manifest's image `name` names (cibox.yaml):
# flake.lock and the image's folder.
{
  pkgs,
  lockset,
  name,
  root,
  recipe,
}: let
  inherit (pkgs) dockerTools;
  locks = lockset {
    inherit root;
    locks = ["flake.lock" "images/${name}/*"];
  };
in
  dockerTools.streamLayeredImage {
    name = "cibox-${name}";
    tag = "lockset-${builtins.substring 7 12 locks.digest}";
    created = "1970-01-01T00:00:01Z";
    # What every image has besides its recipe: /usr/bin/env (`#!/usr/bin/env python3`),
    # CA certificates under /etc/ssl/certs, and an /etc/passwd and /etc/group with root
    # and nobody (65534). cibox runs batches as the invoking uid:gid (65534:65534 when
    # cibox itself runs as root; see `container.user`), so any other uid has no entry
    # here and getpwuid fails for it (Python's getpass.getuser() without USER or
    # LOGNAME, `whoami`). Naming every uid (nss_wrapper, a passwd written at run time)
    # is out of scope.
    contents =
      [
        dockerTools.usrBinEnv
        dockerTools.caCertificates
        dockerTools.fakeNss
      ]
      ++ recipe.contents;
    # What cibox's containers expect: a writable /work (the source is copied there as
    # the invoking user) and a /tmp for HOME.
    extraCommands = ''
      mkdir -p -m 1777 tmp work
      mkdir -p src reports
    '';
    config = {
      Env =
        [
          "PATH=/bin:/usr/bin"
          "LANG=C.UTF-8"
          "SSL_CERT_FILE=/etc/ssl/certs/ca-bundle.crt"
        ]
        ++ (recipe.env or []);
      Cmd = ["/bin/sh"];
      Labels = {
        "org.cibox.lockset" = locks.digest;
        "org.cibox.lockset.files" = locks.text;
      };
    };
  }
