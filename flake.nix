{
  description = "cibox: reproducible, safe GPU CI for large ML projects";

  # One input, pinned in flake.lock: the tool and every image come from this nixpkgs,
  # so an image ID is a function of the lock files.
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-26.05";

  outputs = {
    self,
    nixpkgs,
  }: let
    inherit (nixpkgs) lib;
    systems = ["x86_64-linux" "aarch64-linux"];
    forAllSystems = lib.genAttrs systems;
    lockset = import ./nix/lockset.nix;

    # One image per folder under images/.
    imageNames = builtins.attrNames (lib.filterAttrs (_: type: type == "directory") (builtins.readDir ./images));

    # The crate's source: only what cargo reads (the workspace member included), so an
    # edit to the README, docs or images does not rebuild the tool.
    src = lib.fileset.toSource {
      root = ./.;
      fileset = lib.fileset.unions [
        ./Cargo.toml
        ./Cargo.lock
        ./build.rs
        ./src
        ./tests/nvml-double
      ];
    };

    # The flake's one import of nixpkgs per system. Unfree: exactly NVIDIA's CUDA
    # licences (nix/cuda-unfree.nix). An image that needs CUDA takes `pkgs.pkgsCuda`,
    # nixpkgs' own variant of this set with cudaSupport on and this config; it is
    # evaluated only when that image is.
    pkgsFor = system:
      import nixpkgs {
        inherit system;
        config.allowUnfreePredicate = import ./nix/cuda-unfree.nix;
      };

    perSystem = system: let
      pkgs = pkgsFor system;
      # The commit for `cibox --version`: the flake's source has no .git to ask.
      commit = self.shortRev or self.dirtyShortRev or "unknown";
      cibox = pkgs.callPackage ./nix/package.nix {inherit src commit;};
      image = name:
        import ./nix/image.nix {
          inherit pkgs lockset name;
          root = ./.;
          recipe = import ./images/${name} {inherit pkgs;};
        };
      app = name: description: text: {
        type = "app";
        program = "${pkgs.writeShellScript name text}";
        meta = {inherit description;};
      };
      # nix run .#image-NAME [-- ARGS]: stream images/NAME into the engine and verify it
      # against the lock list of the manifest's image NAME (cibox.yaml here). Each app
      # holds only its own image, so building one never evaluates another.
      imageApp = name:
        app "image-${name}" "Build the ${name} image, load it into the engine and verify it (cibox image load --name ${name})" ''
          set -euo pipefail
          ${image name} | ${cibox}/bin/cibox image load --from - --name ${name} "$@"
        '';
    in {
      packages =
        lib.listToAttrs (map (name: {
            name = "image-${name}";
            value = image name;
          })
          imageNames)
        // {
          inherit cibox;
          default = cibox;
        };
      apps =
        lib.listToAttrs (map (name: {
            name = "image-${name}";
            value = imageApp name;
          })
          imageNames)
        // {
          # nix run .#gpu-batch -- ARGS  is  cibox batch run ARGS
          gpu-batch = app "gpu-batch" "Run cibox batches (cibox batch run)" ''exec ${cibox}/bin/cibox batch run "$@"'';
          image-verify = app "image-verify" "Verify an image against the source's lockset (cibox image verify)" ''exec ${cibox}/bin/cibox image verify "$@"'';
          reproduce = app "reproduce" "Replay a recorded batch (cibox reproduce)" ''exec ${cibox}/bin/cibox reproduce "$@"'';
        };
      # The package with its unit tests. The Nix files' formatting is checked by the test
      # suite (the alejandra crate, tests/it/nix/files.rs), not here: nixpkgs' alejandra is a
      # newer major version than the newest crate, and the two need not agree.
      checks = {inherit cibox;};
      devShells.default = pkgs.mkShell {
        packages = with pkgs; [cargo rustc clippy rustfmt cargo-nextest nix docker-client];
      };
    };

    bySystem = forAllSystems perSystem;
  in {
    packages = lib.mapAttrs (_: s: s.packages) bySystem;
    apps = lib.mapAttrs (_: s: s.apps) bySystem;
    checks = lib.mapAttrs (_: s: s.checks) bySystem;
    devShells = lib.mapAttrs (_: s: s.devShells) bySystem;
  };
}
