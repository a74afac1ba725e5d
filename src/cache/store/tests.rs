use super::*;

fn store() -> (tempfile::TempDir, CacheStore) {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("store");
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(&root)
        .unwrap();
    let s = CacheStore::open(&root, Path::new("/host/store")).unwrap();
    (t, s)
}

fn me() -> (u32, u32) {
    (
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    )
}

/// What a batch reading `cache` now would see, as `name=text` lines.
fn seen(cache: &Cache) -> Vec<String> {
    let r = cache.read().unwrap();
    let dir = cache.dir.join("gens").join(&r.generation);
    let mut out: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            format!("{}={text}", e.file_name().to_string_lossy())
        })
        .collect();
    out.sort();
    out
}

fn layer_write(w: &Writing, name: &str, text: &str) {
    std::fs::write(w.dir.join("upper").join(name), text).unwrap();
}

#[test]
fn a_store_others_may_write_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("open");
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(&root)
        .unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = CacheStore::open(&root, &root).unwrap_err().to_string();
    assert!(e.contains("others may write it"), "{e}");
    let e = CacheStore::open(Path::new("relative"), &root)
        .unwrap_err()
        .to_string();
    assert!(e.contains("absolute"), "{e}");
    let (_t, s) = store();
    assert!(s.cache("p", "../x").is_err());
    assert!(s.cache("..", "x").is_err());
}

#[test]
fn a_promoted_layer_is_what_the_next_reader_sees_and_readers_keep_theirs() {
    let (_t, s) = store();
    let c = s.cache("proj", "models").unwrap();
    assert!(seen(&c).is_empty());
    let held = c.read().unwrap();
    assert!(held.lower.starts_with("/host/store/proj/models/gens"));
    let w = c.write(me()).unwrap();
    assert!(w.host_upper.starts_with("/host/store/proj/models/work"));
    layer_write(&w, "a", "one");
    let p = c.promote(w, 1 << 30).unwrap();
    assert!(p.problems.is_empty(), "{:?}", p.problems);
    assert_eq!(seen(&c), ["a=one"]);
    // The reader that started before still has its generation, until it ends.
    let old = c.dir.join("gens").join(&held.generation);
    assert!(old.is_dir());
    drop(held);
    c.prune(false).unwrap();
    assert!(!old.exists());
    assert_eq!(c.generation_names().len(), 1);
}

#[test]
fn two_trusted_writers_both_land_and_the_later_wins_file_by_file() {
    let (_t, s) = store();
    let c = s.cache("proj", "hf").unwrap();
    // Both read the current generation while they write.
    let _r1 = c.read().unwrap();
    let _r2 = c.read().unwrap();
    let w1 = c.write(me()).unwrap();
    let w2 = c.write(me()).unwrap();
    layer_write(&w1, "shared", "first");
    layer_write(&w1, "only-first", "1");
    layer_write(&w2, "shared", "second");
    layer_write(&w2, "only-second", "2");
    c.promote(w1, 1 << 30).unwrap();
    c.promote(w2, 1 << 30).unwrap();
    assert_eq!(seen(&c), ["only-first=1", "only-second=2", "shared=second"]);
}

#[test]
fn a_discarded_layer_and_a_dead_runs_layer_leave_nothing() {
    let (_t, s) = store();
    let c = s.cache("proj", "ext").unwrap();
    let _r = c.read().unwrap();
    let w = c.write(me()).unwrap();
    layer_write(&w, "poison", "x");
    assert!(c.discard(w).is_empty());
    assert!(seen(&c).is_empty());
    // A run that died: its lock is free, its layer is left until a clean-up.
    let w = c.write(me()).unwrap();
    let dir = w.dir.clone();
    std::mem::forget(w);
    let info = c.info().unwrap();
    assert_eq!(info.writing, 1, "our own lock still holds: {info:?}");
    assert!(dir.exists());
    assert!(seen(&c).is_empty());
}

#[test]
fn a_caches_folder_is_closed_to_others_even_one_made_open() {
    let (_t, s) = store();
    let c = s.cache("proj", "x").unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o777;
    assert_eq!(mode(&c.dir), 0o700);
    std::fs::set_permissions(&c.dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let c = s.cache("proj", "x").unwrap();
    assert_eq!(mode(&c.dir), 0o700);
}

#[test]
fn a_clean_up_removes_what_a_killed_promotion_was_making() {
    let (_t, s) = store();
    let c = s.cache("proj", "x").unwrap();
    std::fs::write(c.dir.join("current.0123abcd"), "00000001-0123abcd\n").unwrap();
    std::fs::create_dir_all(c.dir.join("gens/.00000001-0123abcd/half")).unwrap();
    c.prune(false).unwrap();
    let left: Vec<String> = std::fs::read_dir(&c.dir)
        .unwrap()
        .chain(std::fs::read_dir(c.dir.join("gens")).unwrap())
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.') || n.starts_with("current."))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_generation_or_current_put_there_by_someone_else_is_refused() {
    let (t, s) = store();
    let c = s.cache("proj", "x").unwrap();
    let generation = c.current().unwrap();
    let path = c.dir.join("gens").join(&generation);
    let elsewhere = t.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::remove_dir(&path).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
    let e = c.read().unwrap_err().to_string();
    assert!(e.contains("names no generation"), "{e}");
    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir(&path).unwrap();
    assert!(c.read().is_ok());
    std::os::unix::fs::lchown(c.dir.join("current"), Some(65534), Some(65534))
        .expect("giving a file to another user (the tests run as root)");
    let e = c.read().unwrap_err().to_string();
    assert!(e.contains("is not root's or ours"), "{e}");
}

#[test]
fn a_current_file_that_names_no_generation_is_refused() {
    let (_t, s) = store();
    let c = s.cache("proj", "x").unwrap();
    std::fs::write(c.dir.join("current"), "../../etc\n").unwrap();
    let e = c.read().unwrap_err().to_string();
    assert!(e.contains("names no generation"), "{e}");
    c.prune(true).unwrap();
    assert!(c.read().is_ok());
}
