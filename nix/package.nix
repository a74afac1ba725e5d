# The cibox binary. Dependencies come from Cargo.lock (no vendor hash to maintain).
# The unit tests run in the build; the integration tests need a Docker engine and root,
# which the build sandbox does not have, so they run in CI (`bash .ci/run`) instead.
{
  lib,
  rustPlatform,
  makeWrapper,
  git,
  util-linux,
  src,
  commit,
}: let
  cargoToml = lib.importTOML (src + "/Cargo.toml");
in
  rustPlatform.buildRustPackage {
    pname = cargoToml.package.name;
    inherit (cargoToml.package) version;
    inherit src;
    cargoLock.lockFile = src + "/Cargo.lock";
    cargoTestFlags = ["--bins"];
    # The unit tests that ask git what a checkout ships, or start a process in a
    # session of its own (`setsid`, `flock`: util-linux), find them here: the build
    # sandbox's PATH has neither.
    nativeCheckInputs = [git util-linux];
    nativeBuildInputs = [makeWrapper];
    # cibox asks git about the source it runs (its commit, what ships): the package
    # carries one, found after any git on the user's PATH.
    postInstall = ''
      wrapProgram $out/bin/cibox --suffix PATH : ${lib.makeBinPath [git]}
    '';
    # build.rs puts it into `cibox --version`.
    env.CIBOX_COMMIT = commit;
    meta = {
      description = cargoToml.package.description;
      license = lib.licenses.asl20;
      mainProgram = "cibox";
      platforms = lib.platforms.linux;
    };
  }
