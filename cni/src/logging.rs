//! Logs go to the configured `log_file`, else stderr, at `log_level`; stdout carries only the result.

use std::sync::Mutex;

use std::path::Path;

use hereabouts_ipam::config::LogLevel;
use tracing::level_filters::LevelFilter;
use tracing_subscriber::filter::Targets;
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

pub fn init(log_file: Option<&Path>, level: LogLevel) {
    let ours = filter(level);
    // the client's own debug lines (connections, every request) would bury ours
    let targets = Targets::new()
        .with_default(ours.min(LevelFilter::INFO))
        .with_target("hereabouts_ipam", ours)
        .with_target("hereabouts_cni", ours);
    let builder = tracing_subscriber::fmt().with_ansi(false).with_target(false).with_max_level(ours);
    let file = log_file.and_then(|path| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| {
                eprintln!("hereabouts: cannot open log_file {}: {e}; logging to stderr", path.display());
            })
            .ok()
    });
    // A second init (never expected in one process) is harmless: the first subscriber stays.
    let _ = match file {
        Some(file) => builder.with_writer(Mutex::new(file)).finish().with(targets).try_init(),
        None => builder.with_writer(std::io::stderr).finish().with(targets).try_init(),
    };
}
