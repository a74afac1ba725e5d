//! A file system cibox counts as a network one, without a network: [`FuseDir`] mounts
//! an empty, writable folder through FUSE (on cibox's list of file systems where flock
//! is not reliable), served from a thread of the test process by a minimal daemon that
//! speaks the kernel's FUSE protocol on `/dev/fuse` (no libfuse, no fusermount). Root
//! only (the tests run as root).
//!
//! The daemon answers what checking and writing a folder takes: `INIT`, `GETATTR`,
//! `LOOKUP`, `STATFS`, `CREATE`, `OPEN`, `WRITE`, `FLUSH`, `RELEASE`, `UNLINK`, `MKDIR`;
//! anything else gets `ENOSYS`. Files hold no data (writes are accepted and dropped).

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

const LOOKUP: u32 = 1;
const FORGET: u32 = 2;
const GETATTR: u32 = 3;
const MKDIR: u32 = 9;
const UNLINK: u32 = 10;
const OPEN: u32 = 14;
const WRITE: u32 = 16;
const STATFS: u32 = 17;
const RELEASE: u32 = 18;
const FLUSH: u32 = 25;
const INIT: u32 = 26;
const CREATE: u32 = 35;
const DESTROY: u32 = 38;
const BATCH_FORGET: u32 = 42;

const ENOENT: i32 = 2;
const EEXIST: i32 = 17;
const ENOSYS: i32 = 38;

/// An empty, writable folder on a FUSE mount; unmounted on drop.
pub struct FuseDir {
    mountpoint: tempfile::TempDir,
    server: Option<std::thread::JoinHandle<()>>,
}

impl FuseDir {
    pub fn mount() -> FuseDir {
        assert!(
            nix::unistd::geteuid().is_root(),
            "mounting a FUSE file system needs root (CI runs the tests as root)"
        );
        let mountpoint = tempfile::tempdir().unwrap();
        let dev = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .expect("this test needs /dev/fuse");
        let opts = format!(
            "fd={},rootmode=40000,user_id=0,group_id=0,allow_other",
            dev.as_raw_fd()
        );
        nix::mount::mount(
            Some("cibox-test"),
            mountpoint.path(),
            Some("fuse.cibox-test"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            Some(opts.as_str()),
        )
        .expect("mounting a FUSE file system (needs CAP_SYS_ADMIN)");
        let server = std::thread::spawn(move || serve(dev));
        FuseDir {
            mountpoint,
            server: Some(server),
        }
    }

    pub fn path(&self) -> &Path {
        self.mountpoint.path()
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.path().join(name)
    }
}

impl Drop for FuseDir {
    fn drop(&mut self) {
        // Detached: the daemon's read then ends with ENODEV and its thread returns.
        let _ = nix::mount::umount2(self.path(), nix::mount::MntFlags::MNT_DETACH);
        if let Some(s) = self.server.take() {
            let _ = s.join();
        }
    }
}

/// One node: a folder or an empty file.
struct Node {
    dir: bool,
}

fn serve(mut dev: File) {
    let mut nodes: HashMap<u64, Node> = HashMap::from([(1, Node { dir: true })]);
    let mut names: HashMap<(u64, Vec<u8>), u64> = HashMap::new();
    let mut next = 2u64;
    let mut buf = vec![0u8; (1 << 20) + 4096];
    loop {
        let n = match dev.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(nix::libc::EINTR) => continue,
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOENT) => continue,
            Err(_) => return, // ENODEV: unmounted
        };
        let req = &buf[..n];
        let opcode = u32_at(req, 4);
        let unique = u64_at(req, 8);
        let node = u64_at(req, 16);
        let body = &req[40..];
        let reply: Result<Vec<u8>, i32> = match opcode {
            INIT => Ok(init_out(body)),
            FORGET | BATCH_FORGET => continue,
            DESTROY => Ok(Vec::new()),
            GETATTR => nodes.get(&node).map(|n| attr_out(node, n)).ok_or(ENOENT),
            LOOKUP => names
                .get(&(node, cstr(body)))
                .map(|&ino| entry_out(ino, &nodes[&ino]))
                .ok_or(ENOENT),
            STATFS => Ok(statfs_out()),
            CREATE | MKDIR => {
                // create_in is 16 bytes, mkdir_in 8; the name follows.
                let name = cstr(&body[if opcode == CREATE { 16 } else { 8 }..]);
                if names.contains_key(&(node, name.clone())) {
                    Err(EEXIST)
                } else {
                    let ino = next;
                    next += 1;
                    let made = Node {
                        dir: opcode == MKDIR,
                    };
                    let mut out = entry_out(ino, &made);
                    if opcode == CREATE {
                        out.extend_from_slice(&[0u8; 16]); // open_out: fh 0
                    }
                    nodes.insert(ino, made);
                    names.insert((node, name), ino);
                    Ok(out)
                }
            }
            UNLINK => match names.remove(&(node, cstr(body))) {
                Some(ino) => {
                    nodes.remove(&ino);
                    Ok(Vec::new())
                }
                None => Err(ENOENT),
            },
            OPEN => Ok(vec![0u8; 16]),
            WRITE => {
                let size = u32_at(body, 16);
                let mut out = size.to_le_bytes().to_vec();
                out.extend_from_slice(&[0u8; 4]);
                Ok(out)
            }
            FLUSH | RELEASE => Ok(Vec::new()),
            _ => Err(ENOSYS),
        };
        let (error, payload) = match reply {
            Ok(p) => (0i32, p),
            Err(e) => (-e, Vec::new()),
        };
        let mut out = Vec::with_capacity(16 + payload.len());
        out.extend_from_slice(&((16 + payload.len()) as u32).to_le_bytes());
        out.extend_from_slice(&error.to_le_bytes());
        out.extend_from_slice(&unique.to_le_bytes());
        out.extend_from_slice(&payload);
        if opcode == DESTROY {
            let _ = dev.write_all(&out);
            return;
        }
        if dev.write_all(&out).is_err() {
            return;
        }
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn cstr(b: &[u8]) -> Vec<u8> {
    b.iter().take_while(|&&c| c != 0).copied().collect()
}

/// `fuse_init_out` for protocol 7.31, taking the kernel's major version.
fn init_out(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&u32_at(body, 0).to_le_bytes()); // major
    out.extend_from_slice(&31u32.to_le_bytes()); // minor
    out.extend_from_slice(&u32_at(body, 8).to_le_bytes()); // max_readahead
    out.extend_from_slice(&0u32.to_le_bytes()); // flags
    out.extend_from_slice(&16u16.to_le_bytes()); // max_background
    out.extend_from_slice(&12u16.to_le_bytes()); // congestion_threshold
    out.extend_from_slice(&(1u32 << 20).to_le_bytes()); // max_write
    out.extend_from_slice(&1u32.to_le_bytes()); // time_gran
    out.extend_from_slice(&[0u8; 64 - 28]); // max_pages … unused
    out
}

/// `fuse_attr` (88 bytes): everything root's, folders 1777, files 0644, times 0.
fn attr(ino: u64, node: &Node) -> Vec<u8> {
    let mode: u32 = if node.dir { 0o041777 } else { 0o100644 };
    let mut a = Vec::with_capacity(88);
    a.extend_from_slice(&ino.to_le_bytes());
    a.extend_from_slice(&[0u8; 8 * 5 + 4 * 3]); // size, blocks, times
    a.extend_from_slice(&mode.to_le_bytes());
    a.extend_from_slice(&(if node.dir { 2u32 } else { 1 }).to_le_bytes()); // nlink
    a.extend_from_slice(&[0u8; 4 * 3]); // uid, gid, rdev
    a.extend_from_slice(&4096u32.to_le_bytes()); // blksize
    a.extend_from_slice(&[0u8; 4]); // flags
    a
}

/// `fuse_attr_out`: never cached, so every stat asks.
fn attr_out(ino: u64, node: &Node) -> Vec<u8> {
    let mut out = vec![0u8; 16];
    out.extend_from_slice(&attr(ino, node));
    out
}

/// `fuse_entry_out`: never cached.
fn entry_out(ino: u64, node: &Node) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    out.extend_from_slice(&ino.to_le_bytes());
    out.extend_from_slice(&[0u8; 8 * 3 + 4 * 2]); // generation, validity
    out.extend_from_slice(&attr(ino, node));
    out
}

/// `fuse_statfs_out`: some room, nothing used.
fn statfs_out() -> Vec<u8> {
    let mut out = Vec::with_capacity(80);
    for v in [1u64 << 20, 1 << 20, 1 << 20, 1 << 16, 1 << 16] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for v in [4096u32, 255, 4096, 0] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&[0u8; 24]);
    out
}
