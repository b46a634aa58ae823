//! Start-up: what one invocation costs before it does any work.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::Instant;

use anyhow::{Context as _, bail};

use super::Bench;
use crate::args::Plugin;

impl Bench {
    /// Start-up: wall time of one VERSION invocation (median of 10) and its peak RSS (`/usr/bin/time -v`).
    pub async fn startup(&self) -> anyhow::Result<BTreeMap<Plugin, (f64, Option<f64>)>> {
        let mut out = BTreeMap::new();
        let time = Path::new("/usr/bin/time");
        for plugin in Plugin::BOTH {
            let program = &self.programs[&plugin];
            let version = |wrap: bool| {
                let mut cmd = if wrap {
                    let mut c = std::process::Command::new(time);
                    c.arg("-v").arg(program);
                    c
                } else {
                    std::process::Command::new(program)
                };
                cmd.env_clear()
                    .env("CNI_COMMAND", "VERSION")
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
                let mut child = cmd.spawn()?;
                std::io::Write::write_all(&mut child.stdin.take().context("stdin")?, br#"{"cniVersion":"1.0.0"}"#)?;
                let out = child.wait_with_output()?;
                if !out.status.success() {
                    bail!("{} VERSION failed: {}", plugin.name(), String::from_utf8_lossy(&out.stdout));
                }
                anyhow::Ok(out)
            };
            let mut walls = Vec::new();
            for _ in 0..10 {
                let t0 = Instant::now();
                version(false)?;
                walls.push(t0.elapsed().as_secs_f64() * 1000.0);
            }
            walls.sort_by(f64::total_cmp);
            let rss = if time.is_file() {
                let mut peak: Option<f64> = None;
                for _ in 0..3 {
                    let out = version(true)?;
                    let text = String::from_utf8_lossy(&out.stderr).into_owned();
                    let kb = text
                        .lines()
                        .find_map(|l| l.trim().strip_prefix("Maximum resident set size (kbytes):"))
                        .and_then(|v| v.trim().parse::<f64>().ok());
                    peak = match (peak, kb) {
                        (Some(p), Some(k)) => Some(p.max(k)),
                        (p, k) => p.or(k),
                    };
                }
                peak.map(|kb| kb / 1024.0)
            } else {
                None
            };
            out.insert(plugin, (walls[walls.len() / 2], rss));
        }
        Ok(out)
    }
}
