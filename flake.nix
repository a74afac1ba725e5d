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

    pkgsFor = system:
      import nixpkgs {
        inherit system;
        # Unfree for exactly the CUDA packages the cuda-torch image needs, nothing else.
        config.allowUnfreePredicate = pkg: import ./nix/cuda-unfree.nix lib (lib.getName pkg);
      };

    perSystem = system: let
      pkgs = pkgsFor system;
      cibox = pkgs.callPackage ./nix/package.nix {src = self;};
      images = lib.listToAttrs (map (name: {
          name = "image-${name}";
          value = import ./nix/image.nix {
            inherit pkgs lockset name;
            root = self;
            recipe = import ./images/${name} {inherit pkgs;};
          };
        })
        imageNames);
      script = name: text: pkgs.writeShellScript name text;
      app = name: text: {
        type = "app";
        program = toString (script name text);
      };
    in {
      packages =
        images
        // {
          inherit cibox;
          default = cibox;
        };
      apps = {
        # nix run .#gpu-batch -- ARGS  is  cibox batch run ARGS
        gpu-batch = app "gpu-batch" ''exec ${cibox}/bin/cibox batch run "$@"'';
        # nix run .#image-build -- NAME: stream images/NAME into the engine, print its ID
        image-build = app "image-build" ''
          set -euo pipefail
          case "''${1:-}" in
          ${lib.concatMapStrings (n: ''
              ${n}) stream=${images."image-${n}"} ;;
            '')
            imageNames}
            *) echo "usage: nix run .#image-build -- (${lib.concatStringsSep "|" imageNames})" >&2; exit 2 ;;
          esac
          shift
          "$stream" | ${cibox}/bin/cibox image load --from - "$@"
        '';
        image-verify = app "image-verify" ''exec ${cibox}/bin/cibox image verify "$@"'';
        reproduce = app "reproduce" ''exec ${cibox}/bin/cibox reproduce "$@"'';
      };
      checks = {
        inherit cibox;
        nix-format = pkgs.runCommand "nix-format" {nativeBuildInputs = [pkgs.alejandra];} ''
          alejandra --check ${self} && touch $out
        '';
      };
      devShells.default = pkgs.mkShell {
        packages = with pkgs; [cargo rustc clippy rustfmt cargo-nextest nix alejandra docker-client];
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
