//! Host processes seen through `/proc`: [`pids_with`] (command line holds some words),
//! [`pids_running`] (exact argument vector, live), [`pid_alive`] (a zombie counts as
//! gone) and [`wait_until`], a 10 ms poll with a deadline.

/// The PIDs of processes whose command line holds all of `words`.
pub fn pids_with(words: &[&str]) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| {
                    let line = String::from_utf8_lossy(&c).replace('\0', " ");
                    words.iter().all(|w| line.contains(w))
                })
                .unwrap_or(false)
        })
        .collect()
}

/// The PIDs of live processes whose argument vector is exactly `argv` (a worker found by
/// its host PID, whatever PID namespace it runs in).
pub fn pids_running(argv: &[&str]) -> Vec<i32> {
    let want: Vec<u8> = argv
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want)
                && pid_alive(*pid)
        })
        .collect()
}

/// Polls `cond` every 10 ms for up to `secs`.
pub fn wait_until(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    cond()
}

pub fn pid_alive(pid: i32) -> bool {
    // kill(pid, 0) through /proc: a zombie counts as gone.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

/// Makes `c` run as nobody (65534:65534) in the engine's group `docker`, as a cibox
/// that is not root: `owned` (the project, the reports) become nobody's, and its cache,
/// home and lock dir are `home` (made nobody's too).
pub fn as_nobody(
    c: &mut std::process::Command,
    owned: &[&std::path::Path],
    home: &std::path::Path,
) {
    use std::os::unix::process::CommandExt;
    let docker = std::fs::read_to_string("/etc/group")
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix("docker:x:")?
                .split(':')
                .next()?
                .parse::<u32>()
                .ok()
        })
        .expect("a test runs cibox as nobody in group docker: the host needs that group");
    for path in owned.iter().chain([&home]) {
        let chowned = std::process::Command::new("chown")
            .args(["-R", "65534:65534"])
            .arg(path)
            .status()
            .unwrap();
        assert!(chowned.success(), "chown {}", path.display());
    }
    c.env("XDG_CACHE_HOME", home)
        .env("HOME", home)
        .env("CIBOX_GPU_LOCK_DIR", home.join("locks"));
    // SAFETY: setgroups, setgid, setuid before exec: async-signal-safe. (In this
    // order, as root: std's own `uid` comes before any closure.)
    unsafe {
        c.pre_exec(move || {
            use nix::unistd::{Gid, Uid};
            nix::unistd::setgroups(&[Gid::from_raw(docker)])?;
            nix::unistd::setgid(Gid::from_raw(65534))?;
            nix::unistd::setuid(Uid::from_raw(65534))?;
            Ok(())
        });
    }
}
