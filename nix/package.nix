# The cibox binary. Dependencies come from Cargo.lock (no vendor hash to maintain).
# The unit tests run in the build; the integration tests need a Docker engine and root,
# which the build sandbox does not have, so they run in CI (`bash .ci/run`) instead.
{
  lib,
  rustPlatform,
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
    # build.rs puts it into `cibox --version`.
    env.CIBOX_COMMIT = commit;
    meta = {
      description = cargoToml.package.description;
      license = lib.licenses.asl20;
      mainProgram = "cibox";
      platforms = lib.platforms.linux;
    };
  }
