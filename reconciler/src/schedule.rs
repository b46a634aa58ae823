//! When the cluster reconcile runs: a crontab expression (standard 5 fields, UTC; a leading seconds field is
//! accepted too, for tests), read from the mounted ConfigMap or the flat file, and reloaded when it changes.

use std::path::PathBuf;
use std::time::Duration;

use croner::Cron;
use croner::parser::CronParser;
use k8s_openapi::jiff::Timestamp;
use k8s_openapi::jiff::tz::TimeZone;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Whereabouts' default: once a day at 04:30 UTC.
pub const DEFAULT_EXPRESSION: &str = "30 4 * * *";

/// A parsed schedule.
#[derive(Debug, Clone)]
pub struct Schedule {
    pub expression: String,
    cron: Cron,
}

/// Why a schedule was refused.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    #[error("{source_name}: invalid cron expression {expression:?}: {reason}")]
    Invalid { source_name: String, expression: String, reason: String },
    #[error("{path}: {reason}")]
    Read { path: String, reason: String },
}

impl PartialEq for Schedule {
    fn eq(&self, other: &Self) -> bool {
        self.expression == other.expression
    }
}

impl Schedule {
    /// Parses `expression`; `source_name` says where it came from, for the error.
    pub fn parse(expression: &str, source_name: &str) -> Result<Self, ScheduleError> {
        let invalid = |reason: String| ScheduleError::Invalid {
            source_name: source_name.to_string(),
            expression: expression.to_string(),
            reason,
        };
        let fields = expression.split_whitespace().count();
        if !(5..=6).contains(&fields) {
            return Err(invalid(format!("{fields} fields; expected 5 (minute hour day month weekday)")));
        }
        let cron = CronParser::new().parse(expression).map_err(|e| invalid(e.to_string()))?;
        Ok(Self { expression: expression.trim().to_string(), cron })
    }

    /// The first tick strictly after `t`.
    pub fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        let zoned = t.to_zoned(TimeZone::UTC);
        self.cron.find_next_occurrence(&zoned, false).ok().map(|z| z.timestamp())
    }
}

/// Where the expression is read from, first match wins: an explicit flag, the ConfigMap key file, the flat file's
/// `reconciler_cron_expression`, else the default.
#[derive(Debug, Clone)]
pub struct ScheduleSource {
    pub fixed: Option<String>,
    pub config_file: Option<PathBuf>,
    pub flat_file: Option<PathBuf>,
}

impl ScheduleSource {
    pub fn read(&self) -> Result<Schedule, ScheduleError> {
        if let Some(expr) = &self.fixed {
            return Schedule::parse(expr, "--cron-expression");
        }
        if let Some(path) = self.config_file.as_ref().filter(|p| p.exists()) {
            let text = std::fs::read_to_string(path)
                .map_err(|e| ScheduleError::Read { path: path.display().to_string(), reason: e.to_string() })?;
            return Schedule::parse(text.trim(), &path.display().to_string());
        }
        if let Some(path) = self.flat_file.as_ref().filter(|p| p.exists()) {
            let read_err = |reason: String| ScheduleError::Read { path: path.display().to_string(), reason };
            let text = std::fs::read_to_string(path).map_err(|e| read_err(e.to_string()))?;
            let doc: serde_json::Value = serde_json::from_str(&text).map_err(|e| read_err(e.to_string()))?;
            if let Some(expr) = doc.get("reconciler_cron_expression").and_then(|v| v.as_str()) {
                return Schedule::parse(expr, &format!("{}: reconciler_cron_expression", path.display()));
            }
        }
        Schedule::parse(DEFAULT_EXPRESSION, "default")
    }
}

/// Re-reads `source` every `every` and publishes a changed, valid schedule; an invalid one is logged and the
/// running schedule kept.
pub async fn watch_source(
    source: ScheduleSource,
    tx: watch::Sender<Schedule>,
    every: Duration,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        match source.read() {
            Ok(schedule) if *tx.borrow() != schedule => {
                tracing::info!(expression = %schedule.expression, "reconcile schedule changed");
                tx.send_replace(schedule);
            }
            Ok(_) => {}
            Err(e) => tracing::error!(error = %e, "keeping the running schedule"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_five_fields_and_the_default() {
        let s = Schedule::parse(DEFAULT_EXPRESSION, "t").unwrap();
        let t: Timestamp = "2026-12-02T10:00:00Z".parse().unwrap();
        assert_eq!(s.next_after(t).unwrap().to_string(), "2026-12-03T04:30:00Z");
        let every_minute = Schedule::parse("* * * * *", "t").unwrap();
        assert_eq!(every_minute.next_after(t).unwrap().to_string(), "2026-12-02T10:01:00Z");
        let seconds = Schedule::parse("*/2 * * * * *", "t").unwrap();
        assert_eq!(seconds.next_after(t).unwrap().to_string(), "2026-12-02T10:00:02Z");
    }

    #[test]
    fn invalid_expressions_are_refused_with_their_source() {
        for bad in ["", "* * *", "61 * * * *", "banana * * * *", "* * * * * * * *"] {
            let err = Schedule::parse(bad, "configmap").unwrap_err().to_string();
            assert!(err.starts_with("configmap: invalid cron expression"), "{bad:?}: {err}");
        }
    }
}
