//! Child processes of the control plane, and their clean-up when the test binary ends.
//!
//! A test binary's statics are never dropped, so clean-up hangs on two hooks: `atexit` (the test harness ends with
//! `std::process::exit`, also after a test panicked) stops the processes and removes the state directory, and
//! `PR_SET_PDEATHSIG` kills the processes should the test binary itself be killed. The latter fires when the
//! *thread* that spawned the child exits, so children are spawned from a thread that lives as long as the process.
//! A directory left by a killed run is swept by the next run ([`sweep_stale`]).
#![allow(unsafe_code)]

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Mutex;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Prefix of every state directory, so a later run can find the ones a killed run left.
pub(crate) const DIR_PREFIX: &str = "hereabouts-test-";
const OWNER_FILE: &str = "owner.pid";

struct Registry {
    children: Vec<Child>,
    dirs: Vec<PathBuf>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry { children: Vec::new(), dirs: Vec::new() });

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<u32>>);

static SPAWNER: Mutex<Option<mpsc::Sender<SpawnRequest>>> = Mutex::new(None);

/// Spawns `cmd` from the long-lived spawner thread, with SIGKILL as its parent-death signal, and registers it for
/// clean-up at exit. Returns its pid.
pub(crate) fn spawn(mut cmd: Command) -> std::io::Result<u32> {
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let (tx, rx) = mpsc::channel();
    spawner().send((cmd, tx)).expect("the spawner thread runs for the life of the process");
    rx.recv().expect("the spawner thread answers")
}

fn spawner() -> mpsc::Sender<SpawnRequest> {
    let mut guard = SPAWNER.lock().unwrap();
    guard
        .get_or_insert_with(|| {
            let (tx, rx) = mpsc::channel::<SpawnRequest>();
            std::thread::Builder::new()
                .name("testenv-spawner".into())
                .spawn(move || {
                    for (mut cmd, reply) in rx {
                        let result = cmd.spawn().map(|child| {
                            let pid = child.id();
                            REGISTRY.lock().unwrap().children.push(child);
                            pid
                        });
                        let _ = reply.send(result);
                    }
                    // The sender lives in a static, so this loop never ends: the thread must outlive the children.
                })
                .expect("spawn the testenv spawner thread");
            register_atexit();
            tx
        })
        .clone()
}

/// Kills the child `pid` (spawned by [`spawn`]) with SIGKILL, waits until it is gone, and unregisters it.
pub(crate) fn kill(pid: u32) -> std::io::Result<()> {
    let mut child = {
        let mut registry = REGISTRY.lock().unwrap();
        let Some(at) = registry.children.iter().position(|c| c.id() == pid) else {
            return Err(std::io::Error::new(std::io::ErrorKind::NotFound, format!("no child with pid {pid}")));
        };
        registry.children.swap_remove(at)
    };
    child.kill()?;
    // waited for, so it is gone (its port free) when this returns, and leaves no zombie
    child.wait()?;
    Ok(())
}

/// Registers `dir` for removal at exit and marks it as owned by this process.
pub(crate) fn own_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::write(dir.join(OWNER_FILE), std::process::id().to_string())?;
    REGISTRY.lock().unwrap().dirs.push(dir.to_path_buf());
    Ok(())
}

/// Records the pid of a child in its directory, so a sweep can stop it should this process be killed.
pub(crate) fn record_pid(dir: &Path, name: &str, pid: u32) -> std::io::Result<()> {
    std::fs::write(dir.join(format!("{name}.pid")), pid.to_string())
}

/// Removes state directories under `base` whose owning process is gone, killing the children they record.
pub(crate) fn sweep_stale(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let is_ours = entry.file_name().to_string_lossy().starts_with(DIR_PREFIX);
        let Some(owner) = is_ours.then(|| read_pid(&path.join(OWNER_FILE))).flatten() else { continue };
        if alive(owner) {
            continue;
        }
        for file in std::fs::read_dir(&path).into_iter().flatten().flatten() {
            let name = file.file_name().to_string_lossy().into_owned();
            if name.ends_with(".pid")
                && name != OWNER_FILE
                && let Some(pid) = read_pid(&file.path())
            {
                // SAFETY: kill has no memory effects.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        let _ = std::fs::remove_dir_all(&path);
    }
}

fn read_pid(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

fn register_atexit() {
    extern "C" fn cleanup() {
        let Ok(mut registry) = REGISTRY.lock() else { return };
        for child in &registry.children {
            // SAFETY: kill has no memory effects.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for child in &mut registry.children {
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        for dir in &registry.dirs {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    // SAFETY: `cleanup` is a plain extern "C" function with no arguments, as atexit requires.
    unsafe { libc::atexit(cleanup) };
}
