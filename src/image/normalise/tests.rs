//! Normalising made-up archives: what a layer restates of those below it.

use super::*;
use tar::EntryType as T;

/// An entry of a made-up layer.
enum E {
    Dir(&'static str, u32),
    File(&'static str, u32, &'static str),
    Hard(&'static str, &'static str),
    /// A file with an extended attribute `user.cibox` of this value.
    Xattr(&'static str, &'static str, &'static str),
    /// Written byte for byte (no path clean-up by the tar crate): type, path, mode,
    /// data, link target, PAX records before it.
    Raw(
        tar::EntryType,
        &'static [u8],
        u32,
        &'static [u8],
        &'static [u8],
        &'static [(&'static str, &'static [u8])],
    ),
    /// A char device: path, major, minor.
    Dev(&'static str, u32, u32),
    /// A path long enough for a GNU long name, as the tar crate writes it.
    Long(String, &'static str),
}

fn layer(entries: &[E]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(1_700_000_000);
        h.set_uid(0);
        h.set_gid(0);
        match e {
            E::Dir(path, mode) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(*mode);
                h.set_size(0);
                b.append_data(&mut h, path, std::io::empty()).unwrap();
            }
            E::File(path, mode, text) => {
                h.set_mode(*mode);
                h.set_size(text.len() as u64);
                b.append_data(&mut h, path, text.as_bytes()).unwrap();
            }
            E::Xattr(path, text, value) => {
                b.append_pax_extensions([("SCHILY.xattr.user.cibox", value.as_bytes())])
                    .unwrap();
                h.set_mode(0o644);
                h.set_size(text.len() as u64);
                b.append_data(&mut h, path, text.as_bytes()).unwrap();
            }
            E::Raw(kind, path, mode, data, link, pax) => {
                if !pax.is_empty() {
                    b.append_pax_extensions(pax.iter().map(|(k, v)| (*k, *v)))
                        .unwrap();
                }
                h.set_entry_type(*kind);
                h.set_mode(*mode);
                h.set_size(data.len() as u64);
                let g = h.as_gnu_mut().unwrap();
                g.name = [0; 100];
                g.name[..path.len()].copy_from_slice(path);
                g.linkname = [0; 100];
                g.linkname[..link.len()].copy_from_slice(link);
                h.set_cksum();
                b.append(&h, *data).unwrap();
            }
            E::Dev(path, major, minor) => {
                h.set_entry_type(tar::EntryType::Char);
                h.set_mode(0o600);
                h.set_size(0);
                h.set_device_major(*major).unwrap();
                h.set_device_minor(*minor).unwrap();
                b.append_data(&mut h, path, std::io::empty()).unwrap();
            }
            E::Long(path, text) => {
                h.set_mode(0o644);
                h.set_size(text.len() as u64);
                b.append_data(&mut h, path, text.as_bytes()).unwrap();
            }
            E::Hard(path, target) => {
                h.set_entry_type(tar::EntryType::Link);
                h.set_mode(0o644);
                h.set_size(0);
                b.append_link(&mut h, path, target).unwrap();
            }
        }
    }
    b.into_inner().unwrap()
}

/// Normalises an image whose layers are `layers` (as `docker save` would write it)
/// and returns its ID and each layer's paths.
fn normalised(layers: &[&[E]]) -> (String, Vec<Vec<String>>) {
    normalised_keeping(layers, &[])
}

/// As [`normalised`], the layers at `base` (indices) named as a base image's.
fn normalised_keeping(layers: &[&[E]], base: &[usize]) -> (String, Vec<Vec<String>>) {
    let n = normalise_with(layers, base, serde_json::json!({}), &[]);
    let paths = n
        .layers
        .iter()
        .map(|l| l.keys().map(|k| k.escape_ascii().to_string()).collect())
        .collect();
    (n.id.to_string(), paths)
}

/// Normalises an image whose layers are `layers` (those at `base` a base image's) and
/// whose config is `config`, searching for what `hidden` holds.
fn normalise_with(
    layers: &[&[E]],
    base: &[usize],
    mut config: serde_json::Value,
    hidden: &[Hidden],
) -> Normalised {
    let mut keep = std::collections::HashSet::new();
    let dir = tempfile::tempdir().unwrap();
    let mut b = tar::Builder::new(Vec::new());
    let add = |b: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, path, data).unwrap();
    };
    let mut names = Vec::new();
    let mut ids = Vec::new();
    for (i, l) in layers.iter().enumerate() {
        let bytes = layer(l);
        ids.push(format!("sha256:{}", hex(&Sha256::digest(&bytes))));
        if base.contains(&i) {
            keep.insert(ids[i].clone());
        }
        names.push(format!("l{i}/layer.tar"));
        add(&mut b, &format!("l{i}/layer.tar"), &bytes);
    }
    config["rootfs"] = serde_json::json!({"type": "layers", "diff_ids": ids});
    add(&mut b, "c.json", config.to_string().as_bytes());
    let manifest = serde_json::json!([{"Config": "c.json", "Layers": names}]);
    add(&mut b, "manifest.json", manifest.to_string().as_bytes());
    let saved = dir.path().join("saved.tar");
    std::fs::write(&saved, b.into_inner().unwrap()).unwrap();
    let mask = Masker::of(hidden);
    super::normalise(
        &saved,
        1,
        "cibox/test",
        (&keep, &Default::default()),
        (hidden, &mask),
        dir.path(),
    )
    .unwrap()
}

const DEPS: &[E] = &[E::Dir("deps/", 0o755), E::File("deps/size", 0o644, "21\n")];

#[test]
fn a_layer_restating_the_stage_it_copied_gives_the_id_of_one_that_does_not() {
    // What Docker 20.10's BuildKit wrote under parallel builds: the nonce's layer
    // with the files of the layer below again.
    let (plain, _) = normalised(&[DEPS, &[E::File("nonce", 0o644, "n")]]);
    let (restating, paths) = normalised(&[
        DEPS,
        &[
            E::Dir("./deps/", 0o755),
            E::File("./deps/size", 0o644, "21\n"),
            E::File("nonce", 0o644, "n"),
        ],
    ]);
    assert_eq!(plain, restating);
    assert_eq!(paths[1], ["nonce"]);
}

#[test]
fn what_changes_anything_stays() {
    let (plain, _) = normalised(&[DEPS, &[E::File("nonce", 0o644, "n")]]);
    for (second, stays) in [
        // Another content, another mode, another extended attribute.
        (
            vec![
                E::Xattr("deps/size", "21\n", "x"),
                E::File("nonce", 0o644, "n"),
            ],
            vec!["deps/size", "nonce"],
        ),
        (
            vec![
                E::File("deps/size", 0o644, "22\n"),
                E::File("nonce", 0o644, "n"),
            ],
            vec!["deps/size", "nonce"],
        ),
        (
            vec![
                E::File("deps/size", 0o600, "21\n"),
                E::File("nonce", 0o644, "n"),
            ],
            vec!["deps/size", "nonce"],
        ),
        // A folder with something new in it stays, unchanged or not.
        (
            vec![E::Dir("deps/", 0o755), E::File("deps/more", 0o644, "m")],
            vec!["deps/", "deps/more"],
        ),
        // A file that a hard link of its layer names.
        (
            vec![
                E::File("deps/size", 0o644, "21\n"),
                E::Hard("nonce", "deps/size"),
            ],
            vec!["deps/size", "nonce"],
        ),
        // A file a whiteout of its layer uncovers (removed, then written again).
        (
            vec![
                E::Dir("deps/", 0o755),
                E::File("deps/.wh..wh..opq", 0o644, ""),
                E::File("deps/size", 0o644, "21\n"),
            ],
            vec!["deps/", "deps/.wh..wh..opq", "deps/size"],
        ),
    ] {
        let (id, paths) = normalised(&[DEPS, &second]);
        assert_ne!(id, plain);
        assert_eq!(paths[1], stays);
    }
}

#[test]
fn a_restated_file_counts_against_what_is_below_now_not_what_was() {
    // Layer 2 changes the file, layer 3 writes the first content again: that stays.
    let (_, paths) = normalised(&[
        DEPS,
        &[E::File("deps/size", 0o644, "0\n")],
        &[E::File("deps/size", 0o644, "21\n")],
    ]);
    assert_eq!(paths[2], ["deps/size"]);
    // A whiteout of the folder in layer 2: what layer 3 writes there is new.
    let (_, paths) = normalised(&[DEPS, &[E::File(".wh.deps", 0o644, "")], DEPS]);
    assert_eq!(paths[2], ["deps/", "deps/size"]);
}

// What a pull request's layers might hold (an attack on the restated check).

const NO: &[(&str, &[u8])] = &[];

fn has(paths: &[String], p: &str) -> bool {
    paths.iter().any(|x| x == p)
}

#[test]
fn a_path_spelled_with_dot_slash_or_from_the_root_is_one_path() {
    let (_, p) = normalised(&[
        DEPS,
        &[
            E::Raw(T::Regular, b"/deps/size", 0o644, b"21\n", b"", NO),
            E::File("nonce", 0o644, "n"),
        ],
    ]);
    assert_eq!(p[1], ["nonce"]);
}

#[test]
fn a_path_a_layer_names_twice_stays_both_times() {
    let (_, p) = normalised(&[
        DEPS,
        &[
            E::File("deps/size", 0o644, "21\n"),
            E::Raw(T::Regular, b"./deps/size", 0o644, b"22\n", b"", NO),
        ],
    ]);
    assert_eq!(p[1].len(), 2, "{p:?}");
}

#[test]
fn a_layer_with_a_hard_link_keeps_its_target_however_spelled() {
    let (_, p) = normalised(&[
        DEPS,
        &[
            E::File("deps/size", 0o644, "21\n"),
            E::Hard("h", "./deps/size"),
        ],
    ]);
    assert!(has(&p[1], "deps/size"), "{p:?}");
}

#[test]
fn what_a_root_made_opaque_holds_again_stays() {
    let (_, p) = normalised(&[
        DEPS,
        &[
            E::File(".wh..wh..opq", 0o644, ""),
            E::Dir("deps/", 0o755),
            E::File("deps/size", 0o644, "21\n"),
        ],
    ]);
    assert!(has(&p[1], "deps/size"), "{p:?}");
}

#[test]
fn a_folder_whited_out_and_written_again_in_one_layer_stays() {
    let (_, p) = normalised(&[
        DEPS,
        &[
            E::File(".wh.deps", 0o644, ""),
            E::Dir("deps/", 0o755),
            E::File("deps/size", 0o644, "21\n"),
        ],
    ]);
    assert!(has(&p[1], "deps/size") && has(&p[1], "deps/"), "{p:?}");
}

#[test]
fn a_path_through_a_symlinked_folder_is_another_path() {
    let (_, p) = normalised(&[
        &[
            E::Dir("x/", 0o755),
            E::File("x/f", 0o644, "A"),
            E::Raw(T::Symlink, b"d", 0o777, b"", b"x", NO),
        ],
        &[E::File("d/f", 0o644, "A")],
    ]);
    assert_eq!(p[1], ["d/f"]);
}

#[test]
fn devices_compare_by_their_numbers() {
    let (_, p) = normalised(&[&[E::Dev("null", 1, 3)], &[E::Dev("null", 1, 5)]]);
    assert_eq!(p[1], ["null"]);
    let (_, p) = normalised(&[&[E::Dev("null", 1, 3)], &[E::Dev("null", 1, 3)]]);
    assert!(p[1].is_empty());
}

#[test]
fn layers_restated_whole_become_empty() {
    let (_, p) = normalised(&[DEPS, DEPS, DEPS]);
    assert!(p[1].is_empty() && p[2].is_empty());
}

#[test]
fn a_contiguous_file_compares_by_content() {
    let (_, p) = normalised(&[
        &[E::File("f", 0o644, "AB")],
        &[E::Raw(T::Continuous, b"f", 0o644, b"XY", b"", NO)],
    ]);
    assert_eq!(p[1], ["f"]);
}

#[test]
fn a_hard_link_in_a_later_layer_keeps_its_target() {
    let (_, p) = normalised(&[
        DEPS,
        &[E::File("nonce", 0o644, "n")],
        &[
            E::File("deps/size", 0o644, "21\n"),
            E::Hard("h", "deps/size"),
        ],
    ]);
    assert!(has(&p[2], "deps/size"), "{p:?}");
}

/// `l -> \\xff` below, `l -> \\xfe` above: the targets differ, yet both show as U+FFFD.
#[test]
fn symlink_targets_compare_byte_for_byte() {
    let (_, p) = normalised(&[
        &[E::Raw(T::Symlink, b"l", 0o777, b"", b"\xff", NO)],
        &[E::Raw(T::Symlink, b"l", 0o777, b"", b"\xfe", NO)],
    ]);
    assert_eq!(p[1], ["l"], "a symlink with another target was dropped");
}

/// d/ + d/f; then d becomes a file (hiding d/f); then d/ + d/f again without an opaque
/// marker (as a double-walk differ writes it): d/f is new, not restated.
#[test]
fn a_folder_replaced_by_a_file_forgets_what_it_held() {
    let (_, p) = normalised(&[
        &[E::Dir("d/", 0o755), E::File("d/f", 0o644, "A")],
        &[E::File("d", 0o644, "B")],
        &[E::Dir("d/", 0o755), E::File("d/f", 0o644, "A")],
    ]);
    assert_eq!(p[2], ["d/", "d/f"]);
}

#[test]
fn a_folder_replaced_by_a_symlink_forgets_what_it_held() {
    let (_, p) = normalised(&[
        &[E::Dir("d/", 0o755), E::File("d/f", 0o644, "A")],
        &[
            E::Raw(T::Symlink, b"d", 0o777, b"", b"x", NO),
            E::Dir("x/", 0o755),
        ],
        &[E::File("d/f", 0o644, "A")],
    ]);
    assert_eq!(p[2], ["d/f"]);
}

/// `deps//.wh.size` is `deps/.wh.size` to the engine (and the tar crate writes it so):
/// it uncovers the `deps/size` the layer writes again.
#[test]
fn a_whiteout_spelled_with_a_double_slash_drops_nothing() {
    let (_, p) = normalised(&[
        DEPS,
        &[
            E::Raw(T::Regular, b"deps//.wh.size", 0o644, b"", b"", NO),
            E::File("deps/size", 0o644, "21\n"),
        ],
    ]);
    assert!(has(&p[1], "deps/size"), "{p:?}");
}

/// `a/./b` and `a/b` are one path to the engine: the layer names it twice.
#[test]
fn a_path_named_twice_through_a_dot_drops_nothing() {
    let (_, p) = normalised(&[
        &[E::Dir("a/", 0o755), E::File("a/b", 0o644, "A")],
        &[
            E::Raw(T::Regular, b"a/./b", 0o644, b"X", b"", NO),
            E::File("a/b", 0o644, "A"),
        ],
    ]);
    assert!(has(&p[1], "a/b"), "{p:?}");
}

/// Layer 2 changes `a/b` spelled `a//b`; layer 3's `a/b` = layer 1's is compared with a
/// stale view.
#[test]
fn a_change_spelled_with_a_double_slash_leaves_nothing_to_drop_above() {
    let (_, p) = normalised(&[
        &[E::Dir("a/", 0o755), E::File("a/b", 0o644, "A")],
        &[E::Raw(T::Regular, b"a//b", 0o644, b"B", b"", NO)],
        &[E::File("a/b", 0o644, "A")],
    ]);
    assert_eq!(p[2], ["a/b"]);
}

/// A GNU long name with `..` (the tar crate writes long names raw): the engine cleans it.
#[test]
fn a_long_name_through_dot_dot_leaves_nothing_to_drop_above() {
    let long = format!("{}/../deps/size", "z".repeat(120));
    let l2 = [E::Long(long, "22\n")];
    let (_, p) = normalised(&[DEPS, &l2, &[E::File("deps/size", 0o644, "21\n")]]);
    assert_eq!(p[2], ["deps/size"]);
}

/// A hard link naming its target `deps//size`: the target must stay in the layer.
#[test]
fn a_hard_link_target_spelled_with_a_double_slash_stays() {
    let (_, p) = normalised(&[
        DEPS,
        &[
            E::File("deps/size", 0o644, "21\n"),
            E::Raw(T::Link, b"h", 0o644, b"", b"deps//size", NO),
        ],
    ]);
    assert!(has(&p[1], "deps/size"), "{p:?}");
}

/// A build layer identical to a base layer is copied, never read, so the view of what
/// is below goes stale.
#[test]
fn a_layer_copied_unread_leaves_nothing_to_drop_above() {
    let base: &[E] = &[E::File("f", 0o644, "B")];
    let (_, p) = normalised_keeping(
        &[
            base,
            &[E::File("f", 0o644, "A")],
            base,
            &[E::File("f", 0o644, "A")],
        ],
        &[0],
    );
    assert_eq!(p[3], ["f"]);
}

/// A layer writes `d/y` without `d/`: the engine makes `d` (root, 755) in that layer,
/// hiding layer 1's `d` (700). Layer 3's `d/` (700) is then not restated.
#[test]
fn a_folder_the_engine_makes_hides_the_one_below() {
    let (_, p) = normalised(&[
        &[E::Dir("d/", 0o700), E::File("d/x", 0o644, "x")],
        &[E::File("d/y", 0o644, "y")],
        &[E::Dir("d/", 0o700)],
    ]);
    assert_eq!(p[2], ["d/"]);
}

/// An entry of an unknown type, same size as the file below, other bytes: dropped
/// without its content read.
#[test]
fn an_entry_of_an_unknown_type_drops_nothing() {
    let (_, p) = normalised(&[
        &[E::File("f", 0o644, "AB")],
        &[E::Raw(T::new(b'Z'), b"f", 0o644, b"XY", b"", NO)],
    ]);
    assert_eq!(p[1], ["f"]);
}

/// A folder made opaque by an overlay xattr (the applier sets PAX xattrs as given).
#[test]
fn a_folder_made_opaque_by_an_attribute_drops_nothing() {
    let (_, p) = normalised(&[
        &[E::Dir("d/", 0o755), E::File("d/f", 0o644, "A")],
        &[
            E::Raw(
                T::Directory,
                b"d/",
                0o755,
                b"",
                b"",
                &[("SCHILY.xattr.trusted.overlay.opaque", b"y")],
            ),
            E::File("d/f", 0o644, "A"),
        ],
    ]);
    assert!(has(&p[1], "d/f"), "{p:?}");
}

/// `deps/.wh.` (empty name) whites out `deps` itself in the engine's naive applier.
#[test]
fn a_whiteout_of_an_empty_name_drops_nothing() {
    let (_, p) = normalised(&[
        DEPS,
        &[
            E::Raw(T::Regular, b"deps/.wh.", 0o644, b"", b"", NO),
            E::File("deps/size", 0o644, "21\n"),
        ],
    ]);
    assert!(has(&p[1], "deps/size"), "{p:?}");
}

/// `a` and a hard link `b` to it below; a layer writing `a` again makes another file,
/// and `b` stays the old one: dropping `a` would join them again.
#[test]
fn a_file_hard_linked_below_is_not_restated() {
    let (_, p) = normalised(&[
        &[E::File("a", 0o644, "A"), E::Hard("b", "a")],
        &[E::File("a", 0o644, "A")],
    ]);
    assert_eq!(p[1], ["a"]);
}

// What the host gave the build, wherever a layer or the config holds it.

const SECRET: &str = "hunter2-secret-value";

fn secret(value: &[u8]) -> Vec<Hidden> {
    vec![Hidden {
        what: "secret `tok`".into(),
        value: value.to_vec(),
    }]
}

#[test]
fn a_secret_is_found_in_any_name_link_target_or_record_and_never_shown() {
    let n = normalise_with(
        &[
            DEPS,
            &[
                E::Raw(T::Regular, b"x-hunter2-secret-value", 0o644, b"", b"", NO),
                E::Raw(T::Symlink, b"l", 0o777, b"", b"/hunter2-secret-value", NO),
                E::Raw(T::Link, b"h", 0o644, b"", b"x-hunter2-secret-value", NO),
                E::Xattr("f", "", SECRET),
                E::Raw(
                    T::Regular,
                    b"g",
                    0o644,
                    b"",
                    b"",
                    &[("SCHILY.xattr.user.hunter2-secret-value", b"1")],
                ),
                E::Raw(
                    T::Regular,
                    b"p",
                    0o644,
                    b"",
                    b"",
                    &[("comment", b"hunter2-secret-value")],
                ),
                E::File("c", 0o644, "the hunter2-secret-value\n"),
                E::File("clean", 0o644, "hunter2\n"),
            ],
        ],
        &[],
        serde_json::json!({}),
        &secret(format!("  {SECRET}\n").as_bytes()),
    );
    assert_eq!(
        n.secrets_found,
        [
            "secret `tok`: layer 2, c",
            "secret `tok`: layer 2, f (its extended attribute user.cibox)",
            "secret `tok`: layer 2, g (its extended attribute user.***)",
            "secret `tok`: layer 2, l (its link target)",
            "secret `tok`: layer 2, p (its PAX record comment)",
            "secret `tok`: layer 2, x-*** (its name)",
            "secret `tok`: layer 2, h (its link target)",
        ]
    );
    // A value that is not UTF-8, as bytes; a base image's layers are not searched.
    let n = normalise_with(
        &[
            &[E::Raw(
                T::Regular,
                b"base-\xffsecret\xfe-bytes",
                0o644,
                b"",
                b"",
                NO,
            )],
            &[E::Raw(
                T::Regular,
                b"n-\xffsecret\xfe-bytes!",
                0o644,
                b"",
                b"",
                NO,
            )],
        ],
        &[0],
        serde_json::json!({}),
        &secret(b"\xffsecret\xfe-bytes"),
    );
    assert_eq!(
        n.secrets_found,
        ["secret `tok`: layer 2, n-***! (its name)"]
    );
}

#[test]
fn a_secret_or_a_proxys_credentials_are_found_in_any_string_of_the_config() {
    let proxy = "http://ci:pw@proxy.invalid:3128";
    let mut hidden = secret(SECRET.as_bytes());
    hidden.extend(crate::image::build_args::proxy_credentials(
        "HTTPS_PROXY",
        proxy,
    ));
    let config = serde_json::json!({
        "config": {
            "Env": ["PATH=/bin", format!("HTTPS_PROXY={proxy}")],
            "Labels": {"x-hunter2-secret-value": "1", "ok": "1"},
            "Cmd": ["echo", SECRET],
            "Volumes": {"/v/hunter2-secret-value": {}},
            "User": "1000",
        },
        "history": [
            {"created_by": "COPY x /"},
            {"created_by": format!("RUN |1 HTTPS_PROXY={proxy} /bin/sh -c true"), "comment": SECRET},
        ],
    });
    let n = normalise_with(&[DEPS], &[], config, &hidden);
    let mut found = n.secrets_found.clone();
    found.sort();
    let proxy = "the credentials of proxy variable HTTPS_PROXY";
    assert_eq!(
        found,
        [
            "secret `tok`: the image's config, at `config.Cmd[1]`".to_string(),
            "secret `tok`: the image's config, at `config.Labels.x-***`".into(),
            "secret `tok`: the image's config, at `config.Volumes./v/***`".into(),
            "secret `tok`: the image's history, at `history[1].comment`".into(),
            format!("{proxy}: the image's config, at `config.Env[1]`"),
            format!("{proxy}: the image's history, at `history[1].created_by`"),
        ]
    );
    // A proxy without credentials, and NO_PROXY, are nothing to find.
    let mut hidden = crate::image::build_args::proxy_credentials("HTTP_PROXY", "http://proxy:3128");
    hidden.extend(crate::image::build_args::proxy_credentials(
        "NO_PROXY",
        "localhost",
    ));
    let n = normalise_with(
        &[&[E::File("etc/hosts", 0o644, "127.0.0.1 localhost\n")]],
        &[],
        serde_json::json!({"config": {"Env": ["HTTP_PROXY=http://proxy:3128", "NO_PROXY=localhost"]}}),
        &hidden,
    );
    assert!(n.secrets_found.is_empty(), "{:?}", n.secrets_found);
}

#[test]
fn what_differs_between_two_builds_is_named_masked() {
    // A file named after one line of a key: not the value, so the image is not refused,
    // but never shown.
    let key = b"-----BEGIN KEY-----\nline-one-of-the-key\nline-two-of-the-key\n-----END KEY-----\n";
    let hidden = secret(key);
    let a = normalise_with(
        &[DEPS, &[E::File("x-line-one-of-the-key-A", 0o644, "")]],
        &[],
        serde_json::json!({}),
        &hidden,
    );
    let b = normalise_with(
        &[DEPS, &[E::File("x-line-one-of-the-key-B", 0o644, "")]],
        &[],
        serde_json::json!({}),
        &hidden,
    );
    assert!(a.secrets_found.is_empty(), "{:?}", a.secrets_found);
    assert_eq!(
        differences(&a, &b, 20, &Masker::of(&hidden)),
        [
            "layer 2: x-***-A (only in the first build)",
            "layer 2: x-***-B (only in the second build)"
        ]
    );
}
