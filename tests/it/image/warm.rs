//! A rebuild the engine takes wholly from its cache costs what `docker build` costs
//! (issue 44): the normalised image is known from this user's index, nothing is saved,
//! written or loaded, and the ID is the one the long way gives.

use super::buildkit::{build, built, project};
use crate::common::*;

const SAVING: &str = "saving the engine's build";
const KNOWN: &str = "the engine's build is one normalised before";

#[test]
fn a_warm_rebuild_is_known_and_gives_the_same_id() {
    let (p, _) = project("COPY nonce /nonce\nRUN echo built > /built\n", "");
    let first = build(&p, &[], &[]);
    let img = built(&first);
    assert!(first.stderr.contains(SAVING), "{}", first.stderr);
    // Again, every step from the engine's cache: known, the same ID, verified.
    let again = build(&p, &[], &[]);
    assert_eq!(again.stdout.trim(), img.0, "{}", again.stderr);
    assert!(again.stderr.contains(KNOWN), "{}", again.stderr);
    assert!(!again.stderr.contains(SAVING), "{}", again.stderr);
    // The image gone from the engine: the long way again, to the same ID.
    drop(img);
    let after = build(&p, &[], &[]);
    let img = built(&after);
    assert!(after.stderr.contains(SAVING), "{}", after.stderr);
    assert!(!after.stderr.contains(KNOWN), "{}", after.stderr);
    // A step changed: the long way.
    p.write("nonce", "changed");
    let changed = build(&p, &[], &[]);
    let other = built(&changed);
    assert_ne!(other.0, img.0);
    assert!(changed.stderr.contains(SAVING), "{}", changed.stderr);
    // --check never takes the shortcut.
    let checked = build(&p, &["--check"], &[]);
    assert_eq!(checked.stdout.trim(), other.0, "{}", checked.stderr);
    assert!(!checked.stderr.contains(KNOWN), "{}", checked.stderr);
}

#[test]
fn an_index_others_could_write_is_not_read() {
    let (p, _) = project("COPY nonce /nonce\n", "");
    let img = built(&build(&p, &[], &[]));
    let index = test_cache_home().join("cibox/normalised");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&index, std::fs::Permissions::from_mode(0o777)).unwrap();
    let again = build(&p, &[], &[]);
    assert_eq!(again.stdout.trim(), img.0, "{}", again.stderr);
    assert!(again.stderr.contains(SAVING), "{}", again.stderr);
    // An entry naming another image (written by hand, as only this user could) that
    // lacks the build's lockset labels is a miss, and goes.
    std::fs::set_permissions(&index, std::fs::Permissions::from_mode(0o700)).unwrap();
    let entries: Vec<_> = std::fs::read_dir(&index)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    let (base, _) = project("COPY rootfs/bin/sh /other\n", "");
    let other = built(&build(&base, &[], &[]));
    std::fs::write(
        &entries[0],
        format!("cibox-normalised 1\n{}\n{}\n", other.0, other.0),
    )
    .unwrap();
    let r = build(&p, &[], &[]);
    assert_eq!(r.stdout.trim(), img.0, "{}", r.stderr);
    assert!(r.stderr.contains(SAVING), "{}", r.stderr);
}

/// Issue 43, second attack: an index under a folder others may change is not used (they
/// could swap the folder for one of theirs between cibox's check and its use), and an
/// image taken from the index gets back the `id-` name a load gives it.
#[test]
fn an_index_under_a_folder_others_may_change_is_not_used_and_a_known_image_keeps_its_name() {
    use std::os::unix::fs::PermissionsExt;
    let (p, _) = project("COPY nonce /nonce\n", "");
    let shared = tempfile::tempdir().unwrap();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let with = |envs: &[(&str, &str)]| build(&p, &[], envs);
    let home = shared.path().to_str().unwrap();
    let img = built(&with(&[("XDG_CACHE_HOME", home)]));
    let again = with(&[("XDG_CACHE_HOME", home)]);
    assert_eq!(again.stdout.trim(), img.0, "{}", again.stderr);
    assert!(again.stderr.contains(SAVING), "{}", again.stderr);
    // This test's own index: known, and named again after its name was taken away.
    let r = build(&p, &[], &[]);
    assert!(r.stderr.contains(SAVING), "{}", r.stderr);
    let name = format!("cibox/bk:id-{}", &img.0[7..]);
    let untag = std::process::Command::new("docker")
        .args(["rmi", &name])
        .output()
        .unwrap();
    assert!(
        untag.status.success(),
        "{}",
        String::from_utf8_lossy(&untag.stderr)
    );
    let known = build(&p, &[], &[]);
    assert!(known.stderr.contains(KNOWN), "{}", known.stderr);
    let tags = std::process::Command::new("docker")
        .args(["inspect", "--format", "{{json .RepoTags}}", &img.0])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&tags.stdout).contains(&name),
        "{}",
        String::from_utf8_lossy(&tags.stdout)
    );
}

/// Issue 43, second attack (there before issue 44): a build that adds the same layer
/// twice (`docker save` writes the second as a link to the first) builds.
#[test]
fn a_build_adding_the_same_layer_twice_builds() {
    let (p, _) = project(
        "COPY nonce /a\nCOPY nonce /b\nCOPY nonce /a\nCOPY nonce /b\n",
        "",
    );
    let r = build(&p, &[], &[]);
    built(&r);
}
