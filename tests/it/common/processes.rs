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
