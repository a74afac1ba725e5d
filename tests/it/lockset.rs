//! `cibox image lockset` against GNU sha256sum, and its refusals.

use std::process::Command;

use crate::common::*;

fn sha256sum(dir: &std::path::Path, files: &[&str]) -> String {
    let out = Command::new("sha256sum")
        .current_dir(dir)
        .args(files)
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

fn digest_of(text: &str) -> String {
    let mut c = Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    c.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = c.wait_with_output().unwrap();
    format!(
        "sha256:{}",
        String::from_utf8(out.stdout)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
    )
}

#[test]
fn text_is_what_sha256sum_prints_and_digest_its_hash() {
    let p = Project::new(&manifest_with_locks(&[
        "flake.lock",
        "images/demo/*",
        "reqs/**/*.txt",
    ]));
    p.write("flake.lock", "{}\n");
    p.write("images/demo/Dockerfile", "FROM scratch\n");
    p.write("images/demo/uv.lock", "x");
    p.write(
        "images/demo/sub/ignored",
        "not matched: * does not cross folders",
    );
    p.write("reqs/a.txt", "a");
    p.write("reqs/deep/er/b.txt", "b");
    p.write("reqs/c.md", "not a txt");
    let r = p.cibox(&["image", "lockset"]);
    r.ok();
    let files = [
        "flake.lock",
        "images/demo/Dockerfile",
        "images/demo/uv.lock",
        "reqs/a.txt",
        "reqs/deep/er/b.txt",
    ];
    let expected = sha256sum(p.path(), &files);
    let (text, digest_line) = r.stdout.rsplit_once("digest: ").unwrap();
    assert_eq!(text, expected);
    assert_eq!(digest_line.trim(), digest_of(&expected));
}

#[test]
fn awkward_names_match_sha256sum() {
    let names = [
        "with space",
        "back\\slash",
        "new\nline",
        "ünï",
        "quote'\"",
        "B-upper",
        "a-lower",
    ];
    let locks: Vec<String> = names
        .iter()
        .map(|n| format!("odd/{}", n.replace('\\', "\\\\").replace('\n', "\\n")))
        .collect();
    // YAML double-quoted strings take \\ and \n escapes.
    let list = locks
        .iter()
        .map(|l| format!("\"{}\"", l.replace('"', "\\\"")))
        .collect::<Vec<_>>()
        .join(", ");
    let manifest = format!(
        "version: 1\nproject: t\nimage:\n  locks: [{list}]\nbatches:\n  u: {{gpus: 0, timeout: 1m, run: [x]}}\n"
    );
    let p = Project::new(&manifest);
    let mut paths: Vec<String> = names.iter().map(|n| format!("odd/{n}")).collect();
    for (i, path) in paths.iter().enumerate() {
        p.write(path, format!("content {i}"));
    }
    paths.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    let refs: Vec<&str> = paths.iter().map(String::as_str).collect();
    let expected = sha256sum(p.path(), &refs);
    let r = p.cibox(&["image", "lockset"]);
    r.ok();
    assert_eq!(r.stdout.rsplit_once("digest: ").unwrap().0, expected);
}

#[test]
fn duplicates_across_patterns_count_once() {
    let p = Project::new(&manifest_with_locks(&["a.lock", "*.lock"]));
    p.write("a.lock", "1");
    p.write("b.lock", "2");
    let r = p.cibox(&["image", "lockset"]);
    r.ok();
    assert_eq!(
        r.stdout.rsplit_once("digest: ").unwrap().0,
        sha256sum(p.path(), &["a.lock", "b.lock"])
    );
}

#[test]
fn missing_lock_file_is_exit_2() {
    let p = Project::new(&manifest_with_locks(&["flake.lock"]));
    p.cibox(&["image", "lockset"])
        .fails_with(2, "lock pattern `flake.lock` matches no file");
}

#[test]
fn a_lock_file_misspelt_is_said_at_its_line_with_the_name_meant() {
    let p = Project::new(&manifest_with_locks(&["requirements.lok"]));
    p.write("requirements.lock", "torch==2.9\n");
    p.cibox(&["image", "lockset"]).fails_with(
        2,
        "cibox.yaml:4:11: lock pattern `requirements.lok` matches no file under",
    );
    p.cibox(&["image", "lockset"])
        .fails_with(2, "; did you mean `requirements.lock`?");
}

#[test]
fn glob_matching_nothing_is_exit_2() {
    let p = Project::new(&manifest_with_locks(&["images/*.lock"]));
    p.write("images/readme", "x");
    p.cibox(&["image", "lockset"])
        .fails_with(2, "lock pattern `images/*.lock` matches no file");
}

#[test]
fn empty_lock_list_is_exit_2() {
    let p = Project::new(&manifest_with_locks(&[]));
    p.cibox(&["image", "lockset"])
        .fails_with(2, "image.locks is empty");
}

#[test]
fn unreadable_lock_file_is_exit_2() {
    let p = Project::new(&manifest_with_locks(&["bad.lock"]));
    // Unreadable even for root: reading /proc/self/mem at offset 0 fails with EIO.
    std::os::unix::fs::symlink("/proc/self/mem", p.path().join("bad.lock")).unwrap();
    p.cibox(&["image", "lockset"])
        .fails_with(2, "lock file `bad.lock` cannot be read");
}

#[test]
fn lock_path_escaping_the_project_is_refused() {
    let p = Project::new(&manifest_with_locks(&["../outside.lock"]));
    p.cibox(&["image", "lockset"])
        .fails_with(2, "must be a relative path inside the manifest's folder");
}

#[test]
fn a_trailing_double_star_matches_every_file_below_at_any_depth() {
    // `image/**` is what users write for "everything under image/": it must name the
    // files there and in subfolders at any depth (it named none, exit 2).
    let p = Project::new(&manifest_with_locks(&["image/**"]));
    p.write("image/Dockerfile", "FROM scratch\n");
    p.write("image/.hidden", "h");
    p.write("image/sub/uv.lock", "x");
    p.write("image/sub/deeper/still/req.txt", "y");
    p.write("other/not.lock", "not under image/");
    let r = p.cibox(&["image", "lockset"]);
    r.ok();
    assert_eq!(
        r.stdout.rsplit_once("digest: ").unwrap().0,
        sha256sum(
            p.path(),
            &[
                "image/.hidden",
                "image/Dockerfile",
                "image/sub/deeper/still/req.txt",
                "image/sub/uv.lock",
            ]
        )
    );
    // A folder with no file below still matches nothing.
    let p = Project::new(&manifest_with_locks(&["empty/**"]));
    std::fs::create_dir_all(p.path().join("empty/sub")).unwrap();
    p.cibox(&["image", "lockset"])
        .fails_with(2, "lock pattern `empty/**` matches no file");
}
