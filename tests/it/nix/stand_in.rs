//! The stand-in nixpkgs the flake's outputs and the CUDA predicate are evaluated against
//! (nixpkgs itself cannot be fetched on these machines); no tests of its own.

use std::path::Path;

/// Writes the stand-in nixpkgs into `dir`.
pub(super) fn write_stand_in(dir: &Path) {
    for (name, text) in STAND_IN {
        std::fs::write(dir.join(name), text).unwrap();
    }
}

/// A stand-in for nixpkgs, enough for cibox's flake: the interface of the real one (its
/// `lib` functions, `import nixpkgs { system; config; }`, `pkgsCuda`, `callPackage`,
/// `dockerTools`, `rustPlatform.buildRustPackage`, `writeShellScript`, `mkShell`, with
/// the real argument names), fake derivations that record their arguments as
/// `standIn`, and nixpkgs' unfree check. Switches, as files in its folder: `poison-cuda`
/// (evaluating `pkgsCuda` fails) and `unfree-dep` (torch depends on an unfree package).
const STAND_IN: [(&str, &str); 6] = [
    (
        "flake.nix",
        r##"# A stand-in for nixpkgs, for evaluating cibox's flake offline: the same interface
# (`lib`, `legacyPackages`, `import nixpkgs { system; config; }`), fake derivations that
# record what they were given, and nixpkgs' unfree check.
{
  outputs = {self}: {
    lib = import ./lib.nix;
    legacyPackages = builtins.listToAttrs (map (system: {
      name = system;
      value = import ./. {inherit system;};
    }) ["x86_64-linux" "aarch64-linux"]);
  };
}
"##,
    ),
    (
        "default.nix",
        r##"# As nixpkgs' impure.nix: `system` (or `localSystem`), `config`, `overlays`.
{
  localSystem ? {inherit system;},
  system ? localSystem.system,
  config ? {},
  overlays ? [],
  crossSystem ? null,
} @ args:
assert args ? localSystem -> !(args ? system);
assert overlays == [];
assert crossSystem == null;
  import ./pkgs.nix {
    system = localSystem.system;
    inherit config;
  }
"##,
    ),
    (
        "lib.nix",
        r##"# The part of nixpkgs' lib that cibox's flake uses, with the same names and arguments.
let
  hasPrefix = pre: s: builtins.substring 0 (builtins.stringLength pre) s == pre;
in rec {
  inherit hasPrefix;
  inherit (builtins) listToAttrs mapAttrs attrNames concatStringsSep;
  genAttrs = names: f: listToAttrs (map (n: {name = n; value = f n;}) names);
  filterAttrs = pred: set: listToAttrs (builtins.concatMap (n: let v = set.${n}; in if pred n v then [{name = n; value = v;}] else []) (attrNames set));
  concatMapStrings = f: list: builtins.concatStringsSep "" (map f list);
  optionals = cond: list: if cond then list else [];
  toList = x: if builtins.isList x then x else [x];
  getName = x: x.pname or (builtins.parseDrvName x.name).name;
  importTOML = path: builtins.fromTOML (builtins.readFile path);
  makeBinPath = pkgs: builtins.concatStringsSep ":" (map (p: "${p}/bin") pkgs);
  licenses = import ./licenses.nix;
  platforms = {linux = ["x86_64-linux" "aarch64-linux"];};
  # lib.fileset: unions of existing paths under `root`, copied with only those.
  fileset = {
    unions = list: let
      check = i: p:
        if !(builtins.isPath p)
        then throw "lib.fileset.unions: Element ${toString i} is not a path or file set"
        else if !(builtins.pathExists p)
        then throw "lib.fileset.unions: Element ${toString i} (${toString p}) is a path that does not exist."
        else p;
    in {
      _type = "fileset";
      paths = builtins.genList (i: check i (builtins.elemAt list i)) (builtins.length list);
    };
    toSource = {
      root,
      fileset,
    }: let
      keep = map toString fileset.paths;
      wanted = path: type: let
        p = toString path;
      in
        builtins.any (k: p == k || hasPrefix (k + "/") p || (type == "directory" && hasPrefix (p + "/") k)) keep;
    in
      assert builtins.all (k: hasPrefix (toString root + "/") k) keep; {
        _isLibCleanSourceWith = true;
        origSrc = root;
        name = "source";
        outPath = builtins.path {
          name = "source";
          path = root;
          filter = wanted;
        };
      };
  };
}
"##,
    ),
    (
        "licenses.nix",
        r##"# As lib/licenses.nix: every licence gets shortName (its key unless set), free (true
# unless set) and redistributable. The NVIDIA ones as nixpkgs defines them.
let
  mk = name: l: {shortName = name; free = true; deprecated = false;} // l // {redistributable = l.redistributable or (l.free or true);};
in
  builtins.mapAttrs mk {
    asl20 = {spdxId = "Apache-2.0"; fullName = "Apache License 2.0";};
    bsd3 = {spdxId = "BSD-3-Clause"; fullName = ''BSD 3-clause "New" or "Revised" License'';};
    mit = {spdxId = "MIT"; fullName = "MIT License";};
    gpl3Plus = {spdxId = "GPL-3.0-or-later"; fullName = "GNU General Public License v3.0 or later";};
    gpl2Only = {spdxId = "GPL-2.0-only"; fullName = "GNU General Public License v2.0 only";};
    psfl = {spdxId = "Python-2.0"; fullName = "Python Software Foundation License version 2";};
    unfree = {fullName = "Unfree"; free = false;};
    unfreeRedistributable = {fullName = "Unfree redistributable"; free = false; redistributable = true;};
    nvidiaCuda = {shortName = "CUDA EULA"; fullName = "CUDA Toolkit End User License Agreement (EULA)"; url = "https://docs.nvidia.com/cuda/eula/index.html#cuda-toolkit-supplement-license-agreement"; free = false;};
    nvidiaCudaRedist = {shortName = "CUDA EULA"; fullName = "CUDA Toolkit End User License Agreement (EULA)"; url = "https://docs.nvidia.com/cuda/eula/index.html#cuda-toolkit-supplement-license-agreement"; free = false; redistributable = true;};
  }
"##,
    ),
    (
        "cuda-licenses.nix",
        r##"# As pkgs/development/cuda-modules/_cuda/lib/licenses.nix (and the inline TensorRT one).
{
  cudnn = {shortName = "cuDNN EULA"; fullName = "cuDNN SUPPLEMENT TO SOFTWARE LICENSE AGREEMENT FOR NVIDIA SOFTWARE DEVELOPMENT KITS"; free = false; redistributable = false;};
  cusparse_lt = {shortName = "cuSPARSELt EULA"; fullName = "cuSPARSELt SUPPLEMENT TO SOFTWARE LICENSE AGREEMENT FOR NVIDIA SOFTWARE DEVELOPMENT KITS"; free = false; redistributable = false;};
  cutensor = {shortName = "cuTENSOR EULA"; fullName = "cuTENSOR SUPPLEMENT TO SOFTWARE LICENSE AGREEMENT FOR NVIDIA SOFTWARE DEVELOPMENT KITS"; free = false; redistributable = false;};
  tensorrt = {shortName = "TensorRT EULA"; fullName = "TensorRT SUPPLEMENT TO SOFTWARE LICENSE AGREEMENT FOR NVIDIA SOFTWARE DEVELOPMENT KITS"; free = false; redistributable = false;};
  math_sdk_sla = {shortName = "NVIDIA Math SDK SLA"; fullName = "LICENSE AGREEMENT FOR NVIDIA MATH LIBRARIES SOFTWARE DEVELOPMENT KITS"; free = false; redistributable = false;};
}
"##,
    ),
    (
        "pkgs.nix",
        r##"# The package set: fake derivations (never built) that record what they were given, as
# `standIn`, and nixpkgs' check-meta rule: a package with an unfree licence evaluates only
# when config.allowUnfree or config.allowUnfreePredicate accepts it.
{
  system,
  config,
}: let
  lib = import ./lib.nix;
  inherit (lib) licenses;
  cudaLicenses = import ./cuda-licenses.nix;
  cudaSupport = config.cudaSupport or false;
  allowed = drv: (config.allowUnfree or false) || (config.allowUnfreePredicate or (_: false)) drv;
  mkFake = {
    name ? "${pname}-${version}",
    pname ? name,
    version ? "1.0",
    license ? licenses.mit,
    deps ? [],
    record ? {},
  }: let
    licences = lib.toList license;
    unfree = builtins.any (l: !(l.free or true)) licences;
    depPaths = map (d: d.outPath) deps;
    hash = builtins.substring 0 32 (builtins.hashString "sha256" (builtins.toJSON [name system cudaSupport depPaths]));
    drv = {
      type = "derivation";
      inherit name pname version system;
      meta = {inherit license;};
      outPath = "/nix/store/${hash}-${name}";
      standIn = record // {inherit cudaSupport;};
    };
    shortNames = builtins.concatStringsSep ", " (map (l: l.shortName or "?") licences);
  in
    if unfree && !(allowed drv)
    then throw "Package ‘${name}’ in the stand-in nixpkgs has an unfree license (‘${shortNames}’), refusing to evaluate."
    else builtins.deepSeq depPaths drv;
  simple = pname: license: mkFake {inherit pname license;};

  self = {
    inherit lib config;
    # Deprecated in nixpkgs (pkgs.stdenv.hostPlatform.system): refused here.
    system = throw "stand-in nixpkgs: pkgs.system is deprecated, use pkgs.stdenv.hostPlatform.system";
    path = ./.;
    stdenv = {
      hostPlatform = {inherit system;};
      buildPlatform = {inherit system;};
    };
    pkgsCuda =
      if builtins.pathExists ./poison-cuda
      then throw "stand-in nixpkgs: pkgsCuda was evaluated"
      else
        import ./pkgs.nix {
          inherit system;
          config = config // {
            cudaSupport = true;
            rocmSupport = false;
          };
        };
    callPackage = fn: args: let
      f =
        if builtins.isFunction fn
        then fn
        else import fn;
    in
      f (builtins.intersectAttrs (builtins.functionArgs f) self // args);
    # The script's text lands in the store at evaluation, so a test can read it.
    writeShellScript = name: text: builtins.toFile name "#!/bin/sh\n${text}";
    runCommand = name: env: buildCommand:
      mkFake {
        inherit name;
        record = {inherit env buildCommand;};
      };
    mkShell = {packages ? [], ...} @ args:
      mkFake {
        name = "nix-shell";
        deps = packages;
        record = {packages = map (p: p.name) packages;};
      };
    rustPlatform.buildRustPackage = args: let
      lock = builtins.fromTOML (builtins.readFile args.cargoLock.lockFile);
    in
      builtins.seq (builtins.length lock.package) (mkFake {
        inherit (args) pname version;
        license = args.meta.license;
        record = args // {src = "${args.src}";};
      });
    dockerTools = {
      streamLayeredImage = {
        name,
        tag ? null,
        fromImage ? null,
        contents ? [],
        config ? {},
        architecture ? "amd64",
        created ? "1970-01-01T00:00:01Z",
        mtime ? created,
        uid ? 0,
        gid ? 0,
        uname ? "root",
        gname ? "root",
        maxLayers ? 100,
        extraCommands ? "",
        fakeRootCommands ? "",
        enableFakechroot ? false,
        includeStorePaths ? true,
        includeNixDB ? false,
        passthru ? {},
        meta ? {},
      } @ args:
        mkFake {
          name = "stream-${baseNameOf name}";
          deps = lib.toList contents;
          record = args // {contents = map (c: {inherit (c) name; cudaSupport = c.standIn.cudaSupport;}) (lib.toList contents);};
        };
      usrBinEnv = mkFake {name = "usr-bin-env";};
      caCertificates = mkFake {name = "ca-certificates";};
      fakeNss = mkFake {name = "fake-nss";};
      binSh = mkFake {name = "bin-sh";};
    };
    bashInteractive = simple "bash-interactive" licenses.gpl3Plus;
    coreutils = simple "coreutils" licenses.gpl3Plus;
    git = simple "git" licenses.gpl2Only;
    util-linux = simple "util-linux" licenses.gpl2Only;
    makeWrapper = simple "make-wrapper" licenses.mit;
    cargo = simple "cargo" licenses.mit;
    rustc = simple "rustc" licenses.mit;
    clippy = simple "clippy" licenses.mit;
    rustfmt = simple "rustfmt" licenses.mit;
    cargo-nextest = simple "cargo-nextest" licenses.asl20;
    nix = simple "nix" licenses.mit;
    docker-client = simple "docker" licenses.asl20;
    alejandra = simple "alejandra" licenses.mit;
    python3Packages = {
      pytest = simple "python3.13-pytest" licenses.mit;
      numpy = simple "python3.13-numpy" licenses.bsd3;
      torch = mkFake {
        pname = "python3.13-torch";
        license = licenses.bsd3;
        deps =
          lib.optionals cudaSupport (with self.cudaPackages; [cuda_cudart libcublas cudnn libcusparse_lt nccl])
          # A test's switch: an unfree dependency outside the CUDA family.
          ++ lib.optionals (builtins.pathExists ./unfree-dep) [(simple "nvidia-x11" licenses.unfree)];
      };
    };
    python3 =
      simple "python3" licenses.psfl
      // {
        withPackages = f:
          mkFake {
            name = "python3-3.13-env";
            deps = f self.python3Packages;
          };
      };
    cudaPackages = let
      redist = pname: simple pname licenses.nvidiaCudaRedist;
    in rec {
      cuda_cccl = redist "cuda_cccl";
      libnvvm = redist "libnvvm";
      libnvptxcompiler = redist "libnvptxcompiler";
      cuda_nvcc = mkFake {
        pname = "cuda_nvcc";
        license = licenses.nvidiaCudaRedist;
        deps = [cuda_cccl libnvvm libnvptxcompiler];
      };
      cuda_cudart = redist "cuda_cudart";
      libcublas = redist "libcublas";
      cudnn = simple "cudnn" cudaLicenses.cudnn;
      libcusparse_lt = simple "libcusparse_lt" cudaLicenses.cusparse_lt;
      nccl = simple "nccl" licenses.bsd3;
    };
  };
in
  self
"##,
    ),
];
