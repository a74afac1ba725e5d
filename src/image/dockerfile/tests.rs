use super::*;
use std::collections::HashMap;

fn read(df: &str, args: &[(&str, &str)]) -> Result<Stages, ParseError> {
    let args: HashMap<String, String> = args
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    stages(df, &args, Dialect::CURRENT)
}

fn images(df: &str, args: &[(&str, &str)], target: Option<&str>) -> Vec<String> {
    read(df, args)
        .unwrap()
        .needs(target)
        .unwrap()
        .images
        .into_iter()
        .map(|u| u.image)
        .collect()
}

fn refused(df: &str) -> String {
    read(df, &[]).unwrap_err().to_string()
}

/// BuildKit's own parser test files: each Dockerfile's dump equals its `result`, and
/// each negative case is refused.
#[test]
fn buildkit_parser_test_files() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/buildkit-parser");
    let mut cases = 0;
    for entry in std::fs::read_dir(dir.join("testfiles")).unwrap() {
        let case = entry.unwrap().path();
        let text = std::fs::read_to_string(case.join("Dockerfile")).unwrap();
        let want = std::fs::read_to_string(case.join("result")).unwrap();
        let (nodes, _) = parse::read_nodes(&text, Dialect::CURRENT)
            .unwrap_or_else(|e| panic!("{}: {e}", case.display()));
        if text.contains("syntax=") {
            assert!(
                parse::parse(&text, Dialect::CURRENT).is_err(),
                "{}",
                case.display()
            );
        }
        let got: String = nodes.iter().map(|n| format!("({})\n", n.dump())).collect();
        assert_eq!(got, want, "{}", case.display());
        cases += 1;
    }
    assert!(cases >= 30, "{cases} cases");
    for entry in std::fs::read_dir(dir.join("testfiles-negative")).unwrap() {
        let case = entry.unwrap().path();
        let text = std::fs::read_to_string(case.join("Dockerfile")).unwrap();
        assert!(
            parse::read_nodes(&text, Dialect::CURRENT).is_err(),
            "{} parsed",
            case.display()
        );
    }
}

#[test]
fn finds_base_images() {
    let df = "FROM --platform=linux/amd64 img@sha256:abc AS build\nRUN x\nfrom build\nFROM scratch\nCOPY --from=build / /\nCOPY --from=0 /a /a\nCOPY --from=alpine:3.19 /b /b\n";
    assert_eq!(
        images(df, &[], None),
        ["img@sha256:abc", "scratch", "alpine:3.19"]
    );
}

/// Issue 43: continuations join with nothing between, as BuildKit joins them.
#[test]
fn continuations_join_as_buildkit_joins_them() {
    let s = read("FROM scratch\nARG HTTP_PRO\\\nXY\n", &[]).unwrap();
    assert_eq!(s.declared_args(), ["HTTP_PROXY"]);
    let df = "FROM \\\n    --platform=linux/amd64 \\\n  alpine:3.19 \\\n  AS base\nRUN echo \\\n  FROM not-an-image\nFROM base\nCOPY \\\n  --from=busybox:1 \\\n  /x /x\n";
    assert_eq!(images(df, &[], None), ["alpine:3.19", "busybox:1"]);
    let df = "FROM \\\n# a comment\n\n  debian:12 AS b\nFROM b\n";
    assert_eq!(images(df, &[], None), ["debian:12"]);
    let df = "# escape=`\nFROM `\n  debian:12\nRUN dir c:\\\nFROM scratch\n";
    assert_eq!(images(df, &[], None), ["scratch"]);
    // A keyword or a flag split by a continuation is refused, not guessed.
    assert!(refused("FROM scratch\nCO\\\nPY --from=evil:1 / /\n").contains("keyword"));
    assert!(refused("FROM scratch\nCOPY --fr\\\nom=evil:1 / /\n").contains("flag"));
}

/// Issue 43: a flag with quotes in it, or a mount's CSV quoting, is read as BuildKit
/// reads it or refused; the image it names is never missed.
#[test]
fn quotes_in_flags_are_refused_and_mounts_read_as_csv() {
    assert!(refused("FROM scratch\nCOPY --fr\"om\"=reg/q:1 / /\n").contains("quote"));
    assert!(
        refused("FROM scratch\nRUN --mount=type=bind,f\"rom\"=reg/q:1 true\n").contains("quote")
    );
    // Quotes inside the CSV value are CSV's, after the flag's own are refused: the
    // flag word itself holds none here, so a CSV-quoted field is read as CSV reads it.
    let s = read(
        "FROM scratch\nRUN --mount=type=bind,from=reg/q:1,target=/m true\n",
        &[],
    )
    .unwrap();
    assert_eq!(s.needs(None).unwrap().images[1].image, "reg/q:1");
    assert!(refused("FROM scratch\nCOPY --from=$X / /\n").contains("--from"));
    assert!(refused("FROM scratch\nRUN --mount=type=bind,from=${X} true\n").contains("$"));
    assert!(refused("FROM scratch\nCOPY --FROM=x / /\n").contains("unknown flag"));
}

/// Issue 43: a Dockerfile never picks its frontend, in any form a BuildKit detects.
#[test]
fn a_syntax_directive_is_refused() {
    for df in [
        "# syntax=reg/x:1\nFROM scratch\n",
        "#syntax = reg/x:1\nFROM scratch\n",
        "\u{feff}# SYNTAX=reg/x:1\nFROM scratch\n",
        "#!/usr/bin/env buildctl\n# syntax=reg/x:1\nFROM scratch\n",
        "# escape=\\\n# syntax=reg/x:1\nFROM scratch\n",
        "# foo=bar\n# syntax=reg/x:1\nFROM scratch\n",
        "// syntax=reg/x:1\nFROM scratch\n",
    ] {
        assert!(refused(df).contains("frontend image `reg/x:1`"), "{df}");
    }
    assert!(read("FROM scratch\n# syntax=reg/x:1\n", &[]).is_ok());
    assert!(refused("ARG BUILDKIT_SYNTAX=reg/x:1\nFROM scratch\n").contains("BUILDKIT_"));
    assert!(refused("FROM scratch\nARG BUILDKIT_CACHE_MOUNT_NS\n").contains("BUILDKIT_"));
}

/// Issue 43: `check` is a directive since BuildKit 0.14; before, directives end there.
#[test]
fn directives_after_check_are_refused() {
    assert!(refused("# check=skip=all\n# escape=`\nFROM scratch\n").contains("check"));
    assert!(read("# escape=`\n# check=skip=all\nFROM scratch\n", &[]).is_ok());
    assert!(refused("FROM scratch\r\rRUN x\n").contains("carriage return"));
}

#[test]
fn bases_are_read_with_the_build_arguments_put_in() {
    let df = "ARG CUDA_VERSION=13.0.2\nARG BASE=nvidia/cuda:${CUDA_VERSION}-devel-ubuntu22.04\nARG FINAL=\"nvidia/cuda:${CUDA_VERSION}-base\"\nFROM ${BASE} AS base\nFROM $FINAL AS final\nCOPY --from=base /x /x\n";
    assert_eq!(
        images(df, &[], None),
        [
            "nvidia/cuda:13.0.2-devel-ubuntu22.04",
            "nvidia/cuda:13.0.2-base"
        ]
    );
    assert_eq!(
        images(df, &[("CUDA_VERSION", "12.8.1")], Some("base")),
        ["nvidia/cuda:12.8.1-devel-ubuntu22.04"]
    );
    // Quotes are the shell's: the image is what they hold.
    assert_eq!(images("FROM \"reg/evil\":1\n", &[], None), ["reg/evil:1"]);
    assert!(images("FROM img:${TARGETOS}\n", &[], None)[0].starts_with("img:linux"));
    let s = read("ARG P=linux/arm64\nFROM --platform=$P local:1\n", &[]).unwrap();
    assert_eq!(
        s.needs(None).unwrap().images[0].platform.as_deref(),
        Some("linux/arm64")
    );
    assert!(refused("ARG V=1\nFROM img:${V%1}\n").contains("not read alike"));
}

#[test]
fn a_target_takes_only_the_stages_it_needs() {
    let df = "FROM a:1 AS one\nRUN --mount=type=secret,id=tok,required=true true\nFROM b:1 AS two\nRUN --mount=type=cache,target=/c --mount=type=bind,from=c:1,target=/m true\nFROM one AS test\nCOPY --from=two /x /x\nRUN --mount=type=secret,target=/root/.aws/credentials,required=false true\nFROM d:1 AS other\n";
    let s = read(df, &[]).unwrap();
    assert_eq!(s.names(), ["one", "two", "test", "other"]);
    let needs = s.needs(Some("TEST")).unwrap();
    assert_eq!(
        needs
            .images
            .iter()
            .map(|u| (u.image.as_str(), u.line))
            .collect::<Vec<_>>(),
        [("a:1", 1), ("b:1", 3), ("c:1", 4)]
    );
    assert_eq!(
        needs
            .secrets
            .iter()
            .map(|s| (s.id.as_str(), s.required, s.line))
            .collect::<Vec<_>>(),
        [("tok", true, 2), ("credentials", false, 7)]
    );
    assert_eq!(images(df, &[], None), ["d:1"]);
    let err = s.needs(Some("tset")).unwrap_err();
    assert!(
        err.contains("no stage named `tset` (its stages: one, two, test, other)"),
        "{err}"
    );
}

/// A `--from` may name a stage written later: BuildKit looks them up once all are read.
#[test]
fn a_from_names_any_stage() {
    let df = "FROM scratch AS a\nCOPY --from=b /x /x\nFROM reg/evil:1 AS b\n";
    assert_eq!(images(df, &[], Some("a")), ["scratch", "reg/evil:1"]);
    let df =
        "FROM scratch AS a\nRUN --mount=from=c,target=/m true\nFROM x:1\nFROM reg/evil:1 AS c\n";
    assert_eq!(images(df, &[], Some("a")), ["scratch", "reg/evil:1"]);
}

#[test]
fn steps_that_reach_out_are_named() {
    let df = "FROM scratch\nRUN --network=host true\nRUN --network=none true\nADD https://example.com/x /x\nADD local /y\n";
    let needs = read(df, &[]).unwrap().needs(None).unwrap();
    assert_eq!(
        needs.reach,
        [
            (Reach::Network("host".into()), 2),
            (Reach::Network("none".into()), 3),
            (Reach::Remote("https://example.com/x".into()), 4)
        ]
    );
    assert!(refused("FROM scratch\nRUN --security=insecure true\n").contains("sandbox"));
    assert!(refused("FROM scratch\nRUN --device=/dev/x true\n").contains("device"));
}

/// Heredocs are read where the engine's BuildKit reads them, and their lines are
/// instructions where it does not.
#[test]
fn heredocs_follow_the_dialect() {
    let df = "FROM scratch\nRUN <<USER\nFROM reg/evil:1\nUSER\n";
    let old = stages(df, &HashMap::new(), Dialect { heredocs: false }).unwrap();
    assert_eq!(old.needs(None).unwrap().images[0].image, "reg/evil:1");
    let new = read(df, &[]).unwrap();
    assert_eq!(new.needs(None).unwrap().images[0].image, "scratch");
    let old = stages(
        "FROM scratch\nRUN <<EOF\ntrue\nEOF\n",
        &HashMap::new(),
        Dialect { heredocs: false },
    );
    assert!(old.unwrap_err().why.contains("unknown instruction: TRUE"));
    let df = "FROM scratch\nCOPY <<-\"A\" <<B /x\n\tFROM no:1\n\tA\nFROM no:2\nB\nFROM last:1\n";
    assert_eq!(images(df, &[], None), ["last:1"]);
    assert!(refused("FROM scratch\nRUN <<EOF\ntrue\n").contains("unterminated heredoc"));
    assert_eq!(Dialect::of_api("1.41"), Dialect { heredocs: false });
    assert_eq!(Dialect::of_api("1.43"), Dialect { heredocs: true });
}

#[test]
fn args_are_the_ones_the_dockerfile_declares() {
    let df = "ARG CUDA=12.8\nFROM scratch\nARG TORCH \\\n  FLAVOUR=cu128\nARG NOTE=\"a b\"\n";
    let s = read(df, &[]).unwrap();
    assert_eq!(s.declared_args(), ["CUDA", "TORCH", "FLAVOUR", "NOTE"]);
    assert_eq!(s.arg_lines()[2], ("FLAVOUR".to_string(), 3));
    assert!(is_proxy_arg("https_proxy") && !is_proxy_arg("Https_Proxy"));
}

#[test]
fn platforms_are_normalised() {
    assert_eq!(
        normalise_platform("linux/x86_64"),
        ("linux".into(), "amd64".into(), String::new())
    );
    assert_eq!(
        normalise_platform("linux/arm64/v8"),
        ("linux".into(), "arm64".into(), String::new())
    );
    assert_eq!(normalise_platform("arm64").1, "arm64");
    assert_eq!(
        normalise_platform(""),
        normalise_platform(&format!("linux/{}", host_arch()))
    );
    assert_eq!(normalise_platform("").1, host_arch());
}

/// Real projects' Dockerfiles (tests/corpus/dockerfiles, their licences beside them)
/// read as BuildKit reads them: the images each build takes with its defaults.
#[test]
fn real_projects_dockerfiles() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/dockerfiles");
    let read_file = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
    let cases: [(&str, Dialect, &[&str]); 5] = [
        (
            "vllm.Dockerfile",
            Dialect::CURRENT,
            &[
                "nvidia/cuda:13.0.2-devel-ubuntu22.04",
                "nvidia/cuda:13.0.2-base-ubuntu22.04",
            ],
        ),
        (
            "vllm-rocm_base.Dockerfile",
            Dialect::CURRENT,
            &["rocm/dev-ubuntu-22.04:7.2.2-complete"],
        ),
        (
            "sglang.Dockerfile",
            Dialect::CURRENT,
            &["nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04", "scratch"],
        ),
        (
            "sglang-rocm.Dockerfile",
            Dialect::CURRENT,
            &["rocm/sgl-dev:rocm7-vllm-20250904", "scratch"],
        ),
        (
            "verl-stable-vllm.Dockerfile",
            Dialect { heredocs: false },
            &["nvidia/cuda:12.9.1-devel-ubuntu22.04"],
        ),
    ];
    for (name, dialect, want) in cases {
        let s = stages(&read_file(name), &HashMap::new(), dialect)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let got: Vec<String> = s
            .needs(None)
            .unwrap()
            .images
            .into_iter()
            .map(|u| u.image)
            .collect();
        assert_eq!(got, want, "{name}");
    }
    // SGLang's ROCm recipe has heredocs: a BuildKit without them (Docker 20.10) reads
    // their lines as instructions, and cibox refuses what it would then fail on.
    let err = stages(
        &read_file("sglang-rocm.Dockerfile"),
        &HashMap::new(),
        Dialect { heredocs: false },
    )
    .unwrap_err();
    assert_eq!(
        (err.line, err.why.as_str()),
        (572, "unknown instruction: IMPORT")
    );
    // vLLM's glm51 recipe picks a frontend image: refused.
    let err = stages(
        &read_file("vllm-glm51.Dockerfile"),
        &HashMap::new(),
        Dialect::CURRENT,
    )
    .unwrap_err();
    assert!(err.why.contains("docker/dockerfile:1.7"), "{err}");
}

/// Issue 43, second attack: what BuildKit 0.8 reads otherwise than later versions, or
/// than cibox did, is refused or read as 0.8 reads it.
#[test]
fn the_second_attacks_readings() {
    // `${X-w}` is nothing to BuildKit 0.8: refused, not read as `w`.
    assert!(refused("ARG V=${NOPE-amd64}\nFROM reg/x-${V:-evil}:1\n").contains("not read alike"));
    // Under a backtick escape, BuildKit 0.8 still splits flags at `\\`.
    let df = "# escape=`\nFROM scratch\nRUN --mount=type=secret,id=x,target=/t\\ --mount=type=bind,from=reg/evil:1,target=/e true\n";
    assert!(refused(df).contains("escape character"));
    // A mount's `from` names a stage by name only: `from=0` is the image `0`.
    let df = "FROM scratch AS a\nRUN --mount=from=0,target=/m true\n";
    assert_eq!(images(df, &[], None), ["scratch", "0"]);
    // The platform arguments have no variant on this host but are there.
    assert_eq!(images("FROM img:x${TARGETVARIANT}\n", &[], None), ["img:x"]);
}

/// Issue 43, third look: an `ARG` before the first `FROM` that declares again, without
/// a value, one that has a value (a platform argument, an earlier `ARG`) is emptied by
/// BuildKit 0.8 and kept by later versions: refused.
#[test]
fn a_global_arg_declared_again_without_a_value_is_refused() {
    assert!(refused("ARG TARGETARCH\nFROM reg/x${TARGETARCH}z:1\n").contains("declares again"));
    assert!(refused("ARG V=amd64\nARG V\nFROM reg/x${V}z:1\n").contains("declares again"));
    assert_eq!(
        images("ARG V\nFROM reg/x${V}z:1\n", &[], None),
        ["reg/xz:1"]
    );
    assert_eq!(
        images("ARG V\nFROM reg/x${V}z:1\n", &[("V", "y")], None),
        ["reg/xyz:1"]
    );
}

/// Input a pull request could make deep is read without deep recursion.
#[test]
fn deep_input_is_refused_not_recursed() {
    let df = format!("FROM scratch\n{}RUN true\n", "ONBUILD ".repeat(8000));
    assert!(refused(&df).contains("ONBUILD ONBUILD"));
}
