//! The CUDA unfree predicate (`nix/cuda-unfree.nix`) accepts exactly NVIDIA's CUDA
//! licences, as nixpkgs (here its stand-in) defines them.

use std::process::Command;

use super::stand_in::write_stand_in;
use super::{repo, require_nix};

#[test]
fn the_cuda_predicate_accepts_exactly_the_cuda_licences() {
    require_nix();
    let stand_in = tempfile::tempdir().unwrap();
    write_stand_in(stand_in.path());
    // Licences as nixpkgs defines them (lib.licenses, _cuda.lib.licenses); meta.license
    // is one licence or a list.
    let expr = format!(
        r#"let
  accept = import {predicate};
  l = import {dir}/licenses.nix;
  c = import {dir}/cuda-licenses.nix;
  pkg = license: {{ pname = "p"; meta = {{ inherit license; }}; }};
  judge = cases: builtins.mapAttrs (_: license: accept (pkg license)) cases;
in {{
  accepted = judge {{
    nvidiaCuda = l.nvidiaCuda;
    nvidiaCudaRedist = l.nvidiaCudaRedist;
    inList = [ l.nvidiaCudaRedist ];
    withFree = [ l.asl20 l.nvidiaCudaRedist ];
    cudnn = c.cudnn;
    cusparseLt = c.cusparse_lt;
    cutensor = c.cutensor;
    tensorrt = l.unfreeRedistributable // c.tensorrt;
    mathSdk = c.math_sdk_sla;
    twoCuda = [ c.cudnn l.nvidiaCuda ];
  }};
  refused = judge {{
    unfree = l.unfree;
    unfreeRedistributable = l.unfreeRedistributable;
    cudaAndUnfree = [ l.nvidiaCuda l.unfree ];
    optix = {{ shortName = "NVidia OptiX EULA"; fullName = "NVidia OptiX EULA"; free = false; }};
    driver = {{ shortName = "nvidia"; fullName = "This License For Customer Use of NVIDIA Software"; free = false; }};
    lookalike = {{ fullName = "CUDA Toolkit End User License Agreement (EULA)"; free = false; }};
    aString = "unfree";
    none = [ ];
  }};
  noMeta = accept {{ pname = "p"; }};
}}"#,
        predicate = repo().join("nix/cuda-unfree.nix").display(),
        dir = stand_in.path().display()
    );
    let out = Command::new("nix-instantiate")
        .args(["--eval", "--strict", "--json", "-E", &expr])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for (case, ok) in v["accepted"].as_object().unwrap() {
        assert_eq!(
            ok.as_bool(),
            Some(true),
            "the CUDA predicate refused `{case}`"
        );
    }
    for (case, ok) in v["refused"].as_object().unwrap() {
        assert_eq!(
            ok.as_bool(),
            Some(false),
            "the CUDA predicate accepted `{case}`"
        );
    }
    assert_eq!(v["accepted"].as_object().unwrap().len(), 10);
    assert_eq!(v["refused"].as_object().unwrap().len(), 8);
    assert_eq!(v["noMeta"].as_bool(), Some(false), "a package without meta");
}
