//! Atomic file writes: a temp file next to the target (same directory, so the same filesystem), filled, given its
//! mode, fsynced and renamed over the target, then the directory fsynced. A reader (the CNI plugin, a runtime
//! executing the binary) sees the old file or the new one, never a half-written one; renaming over a binary that
//! is running is fine (writing into it would fail with ETXTBSY).

use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, ErrorKind, Read};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use tracing::{debug, info, warn};

/// Temp files are `.<name>.tmp-<pid>-<nanos>-<n>`: hidden, and never ending in `.conf` (a runtime reading a CNI
/// directory must not pick one up).
const TEMP_MARK: &str = ".tmp-";

/// A temp file of ours older than this was left by a writer that died; it is removed.
const STALE_AFTER: Duration = Duration::from_secs(600);

static COUNTER: AtomicU64 = AtomicU64::new(0);

fn temp_prefix(name: &str) -> String {
    format!(".{name}{TEMP_MARK}")
}

fn parts(path: &Path) -> anyhow::Result<(&Path, &str)> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str());
    match name {
        Some(name) => Ok((dir, name)),
        None => bail!("{}: not a file path with a UTF-8 name", path.display()),
    }
}

fn temp_path(path: &Path) -> anyhow::Result<PathBuf> {
    let (dir, name) = parts(path)?;
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    Ok(dir.join(format!("{}{}-{nanos}-{n}", temp_prefix(name), std::process::id())))
}

/// The permission bits of `path` (without the file type), `None` when it does not exist.
pub(super) fn mode_of(path: &Path) -> anyhow::Result<Option<u32>> {
    match fs::metadata(path) {
        Ok(m) => Ok(Some(m.permissions().mode() & 0o7777)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("stat {}", path.display())),
    }
}

/// Whether `path` exists (a dangling symlink counts as absent).
pub(super) fn exists(path: &Path) -> anyhow::Result<bool> {
    Ok(mode_of(path)?.is_some())
}

/// Creates `dir` and its parents (mode 0755) if missing.
pub(super) fn create_dir(dir: &Path) -> anyhow::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .with_context(|| format!("create directory {}", dir.display()))
}

/// Replaces `path` atomically with a file of mode `mode` that `fill` writes. The temp file is created 0600, so a
/// secret is never readable by others, even for a moment.
pub(super) fn write_atomic_with(
    path: &Path,
    mode: u32,
    fill: impl FnOnce(&mut File) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let (dir, _) = parts(path)?;
    let tmp = temp_path(path)?;
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("create temp file {}", tmp.display()))?;
    let written = (|| {
        fill(&mut file)?;
        file.set_permissions(Permissions::from_mode(mode))
            .with_context(|| format!("chmod {mode:o} {}", tmp.display()))?;
        file.sync_all().with_context(|| format!("fsync {}", tmp.display()))?;
        drop(file);
        fs::rename(&tmp, path).with_context(|| format!("rename {} to {}", tmp.display(), path.display()))
    })();
    if let Err(e) = written {
        if let Err(rm) = fs::remove_file(&tmp)
            && rm.kind() != ErrorKind::NotFound
        {
            warn!(path = %tmp.display(), error = %rm, "could not remove temp file");
        }
        return Err(e);
    }
    // The rename is done; the directory's fsync only makes it durable across a crash of the node.
    if let Err(e) = File::open(dir).and_then(|d| d.sync_all()) {
        warn!(dir = %dir.display(), error = %e, "fsync of directory failed");
    }
    Ok(())
}

/// Replaces `path` atomically with `contents` (mode `mode`) unless it already holds exactly that. Returns whether
/// it wrote.
pub(super) fn write_if_changed(path: &Path, contents: &[u8], mode: u32) -> anyhow::Result<bool> {
    match fs::read(path) {
        Ok(existing) if existing == contents && mode_of(path)? == Some(mode) => return Ok(false),
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("read {}", path.display())),
    }
    write_atomic_with(path, mode, |f| {
        io::Write::write_all(f, contents).with_context(|| format!("write {}", path.display()))
    })?;
    Ok(true)
}

/// Installs `src` as `dst` (mode 0755) unless `dst` already has the same size and bytes (then only its mode is
/// corrected), so a restart does not churn the host's binary. Returns whether it copied.
pub(super) fn install_binary(src: &Path, dst: &Path) -> anyhow::Result<bool> {
    let meta = fs::metadata(src).with_context(|| format!("stat source binary {}", src.display()))?;
    if !meta.is_file() {
        bail!("source binary {} is not a regular file", src.display());
    }
    if same_content(src, meta.len(), dst)? {
        if mode_of(dst)? != Some(0o755) {
            fs::set_permissions(dst, Permissions::from_mode(0o755))
                .with_context(|| format!("chmod 755 {}", dst.display()))?;
            info!(path = %dst.display(), "CNI binary up to date; mode set to 0755");
        }
        return Ok(false);
    }
    let mut input = File::open(src).with_context(|| format!("open source binary {}", src.display()))?;
    write_atomic_with(dst, 0o755, |f| {
        let n = io::copy(&mut input, f).with_context(|| format!("copy {} to {}", src.display(), dst.display()))?;
        if n != meta.len() {
            bail!("copy {} to {}: {n} bytes copied, {} expected", src.display(), dst.display(), meta.len());
        }
        Ok(())
    })?;
    Ok(true)
}

/// Whether `b` is a regular file of `a_len` bytes with the same bytes as `a`. Comparing the bytes costs the same
/// reads as hashing both and cannot collide.
pub(super) fn same_content(a: &Path, a_len: u64, b: &Path) -> anyhow::Result<bool> {
    let meta = match fs::metadata(b) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e).with_context(|| format!("stat {}", b.display())),
    };
    if !meta.is_file() || meta.len() != a_len {
        return Ok(false);
    }
    let mut fa = File::open(a).with_context(|| format!("open {}", a.display()))?;
    let mut fb = File::open(b).with_context(|| format!("open {}", b.display()))?;
    let mut ba = vec![0u8; 1 << 16];
    let mut bb = vec![0u8; 1 << 16];
    loop {
        let na = read_full(&mut fa, &mut ba).with_context(|| format!("read {}", a.display()))?;
        let nb = read_full(&mut fb, &mut bb).with_context(|| format!("read {}", b.display()))?;
        if na != nb || ba[..na] != bb[..nb] {
            return Ok(false);
        }
        if na == 0 {
            return Ok(true);
        }
    }
}

/// Reads until `buf` is full or the end of the file.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Removes the temp files of `path` that a writer which died left behind (older than [`STALE_AFTER`]). Best
/// effort: failures are logged, not returned.
pub(super) fn sweep_stale_temps(path: &Path) {
    let Ok((dir, name)) = parts(path) else { return };
    let prefix = temp_prefix(name);
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            debug!(dir = %dir.display(), error = %e, "cannot list directory for stale temp files");
            return;
        }
    };
    for entry in entries.flatten() {
        if !entry.file_name().to_str().is_some_and(|n| n.starts_with(&prefix)) {
            continue;
        }
        let stale =
            entry.metadata().and_then(|m| m.modified()).is_ok_and(|t| t.elapsed().is_ok_and(|age| age > STALE_AFTER));
        if stale {
            match fs::remove_file(entry.path()) {
                Ok(()) => info!(path = %entry.path().display(), "removed stale temp file"),
                Err(e) => warn!(path = %entry.path().display(), error = %e, "could not remove stale temp file"),
            }
        }
    }
}
