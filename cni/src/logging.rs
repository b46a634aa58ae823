//! Logs go to the configured `log_file`, else stderr, at `log_level` (or `RUST_LOG`); stdout carries only the
//! result.

use std::sync::Mutex;

use std::path::Path;

use hereabouts_ipam::config::LogLevel;
use tracing::level_filters::LevelFilter;
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

fn filter(level: LogLevel) -> LevelFilter {
    match level {
        LogLevel::Debug => LevelFilter::DEBUG,
        LogLevel::Verbose | LogLevel::Info => LevelFilter::INFO,
        LogLevel::Error => LevelFilter::ERROR,
        LogLevel::Panic => LevelFilter::OFF,
    }
}

/// `RUST_LOG`, when the runtime passes one that parses, overrides `log_level` (a runtime rarely passes its own
/// environment on; a debugging operator may).
fn from_environment() -> Option<EnvFilter> {
    let directives = std::env::var("RUST_LOG").ok().filter(|d| !d.trim().is_empty())?;
    EnvFilter::try_new(&directives)
        .map_err(|e| eprintln!("hereabouts: RUST_LOG={directives:?} does not parse ({e}); using log_level"))
        .ok()
}

/// Appends to `path`, created if missing, never through a symlink: someone able to plant one in a log directory
/// must not steer root's writes.
fn open_log(path: &Path) -> std::io::Result<std::fs::File> {
    std::os::unix::fs::OpenOptionsExt::custom_flags(
        std::fs::OpenOptions::new().create(true).append(true),
        libc::O_NOFOLLOW,
    )
    .open(path)
}

pub fn init(log_file: Option<&Path>, level: LogLevel) {
    let ours = filter(level);
    // the client's own debug lines (connections, every request) would bury ours
    let targets = Targets::new()
        .with_default(ours.min(LevelFilter::INFO))
        .with_target("hereabouts_ipam", ours)
        .with_target("hereabouts_cni", ours);
    let env = from_environment();
    let targets = env.is_none().then_some(targets);
    // the layers below decide what passes
    let builder = tracing_subscriber::fmt().with_ansi(false).with_target(false).with_max_level(LevelFilter::TRACE);
    let file = log_file.and_then(|path| {
        open_log(path)
            .map_err(|e| {
                eprintln!("hereabouts: cannot open log_file {}: {e}; logging to stderr", path.display());
            })
            .ok()
    });
    // A second init (never expected in one process) is harmless: the first subscriber stays.
    let _ = match file {
        Some(file) => builder.with_writer(Mutex::new(file)).finish().with(env).with(targets).try_init(),
        None => builder.with_writer(std::io::stderr).finish().with(env).with(targets).try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_is_not_opened_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("precious");
        std::fs::write(&target, "untouched").unwrap();
        let link = dir.path().join("hereabouts.log");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(open_log(&link).is_err(), "opened through the symlink");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "untouched");

        let plain = dir.path().join("plain.log");
        std::io::Write::write_all(&mut open_log(&plain).unwrap(), b"line\n").unwrap();
        std::io::Write::write_all(&mut open_log(&plain).unwrap(), b"line\n").unwrap();
        assert_eq!(std::fs::read_to_string(&plain).unwrap(), "line\nline\n", "appends");
    }
}
