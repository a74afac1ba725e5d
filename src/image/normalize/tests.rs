//! Normalising made-up archives: what a layer restates of those below it.

use super::*;

/// An entry of a made-up layer.
enum E {
    Dir(&'static str, u32),
    File(&'static str, u32, &'static str),
    Hard(&'static str, &'static str),
    /// A file with an extended attribute `user.cibox` of this value.
    Xattr(&'static str, &'static str, &'static str),
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
        names.push(format!("l{i}/layer.tar"));
        add(&mut b, &format!("l{i}/layer.tar"), &bytes);
    }
    let config = serde_json::json!({"rootfs": {"type": "layers", "diff_ids": ids}});
    add(&mut b, "c.json", config.to_string().as_bytes());
    let manifest = serde_json::json!([{"Config": "c.json", "Layers": names}]);
    add(&mut b, "manifest.json", manifest.to_string().as_bytes());
    let saved = dir.path().join("saved.tar");
    std::fs::write(&saved, b.into_inner().unwrap()).unwrap();
    let n = super::normalise(
        &saved,
        1,
        "cibox/test",
        &Default::default(),
        &[],
        dir.path(),
    )
    .unwrap();
    let paths = n
        .layers
        .iter()
        .map(|l| l.keys().cloned().collect())
        .collect();
    (n.id.to_string(), paths)
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
