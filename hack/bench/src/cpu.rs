//! Where a burst's CPU went, from /proc: the machine's busy time, the bench's finished children (the CNI
//! processes it waited for), and named running processes (the agents). Clock ticks are read with `getconf`.

use std::time::Instant;

/// CPU seconds at one moment.
#[derive(Debug, Clone)]
pub struct Sample {
    at: Instant,
    /// Every core's busy time (not idle, not waiting for I/O).
    busy: f64,
    /// The bench's waited-for children: the invocations that ended.
    children: f64,
    /// The processes followed, summed.
    followed: f64,
}

/// What happened between two samples.
#[derive(Debug, Clone, Copy)]
pub struct Spent {
    pub wall: f64,
    pub busy: f64,
    pub children: f64,
    pub followed: f64,
}

fn ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
        .unwrap_or(100.0)
}

/// The fields of `/proc/<pid>/stat` after the command name (the first is the state, field 3).
fn stat_fields(pid: &str) -> Option<Vec<u64>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    Some(rest.split_whitespace().skip(1).map(|f| f.parse().unwrap_or(0)).collect())
}

/// The machine's busy time in ticks: user, nice, system, irq and softirq (not idle, iowait or steal), from the
/// first line of `/proc/stat`.
fn busy_ticks() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu: Vec<u64> = text.lines().next()?.split_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
    let (idle, iowait) = (*cpu.get(3)?, *cpu.get(4)?);
    Some(cpu.iter().take(7).sum::<u64>() - idle - iowait)
}

/// Now, following the processes `pids`.
pub fn sample(pids: &[u32]) -> Sample {
    let hz = ticks_per_second();
    // fields 14-17 of stat: utime, stime, cutime, cstime; `stat_fields` starts at field 4
    let own = stat_fields("self").unwrap_or_default();
    let children = own.get(12).copied().unwrap_or(0) + own.get(13).copied().unwrap_or(0);
    let followed: u64 = pids
        .iter()
        .filter_map(|pid| stat_fields(&pid.to_string()))
        .map(|f| f.get(10).copied().unwrap_or(0) + f.get(11).copied().unwrap_or(0))
        .sum();
    Sample {
        at: Instant::now(),
        busy: busy_ticks().unwrap_or(0) as f64 / hz,
        children: children as f64 / hz,
        followed: followed as f64 / hz,
    }
}

impl Sample {
    /// What was spent from `self` until `later`.
    pub fn until(&self, later: &Sample) -> Spent {
        Spent {
            wall: later.at.duration_since(self.at).as_secs_f64(),
            busy: later.busy - self.busy,
            children: later.children - self.children,
            followed: later.followed - self.followed,
        }
    }
}

impl Spent {
    /// One line on where the CPU of a burst of `adds` invocations went.
    pub fn line(&self, what: &str, adds: usize) -> String {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        // /proc counts in clock ticks (10 ms), each process its own: the sums can exceed the machine's busy time
        // by a few ticks when the rest is near nothing (a warm burst printed -0.01 s)
        let rest = (self.busy - self.children - self.followed).max(0.0);
        format!(
            "{what}: the burst took {:.2} s on {cores} cores; the machine was busy {:.2} s of CPU ({:.0} % of the \
             cores): the {adds} CNI processes {:.1} ms each ({:.2} s in all), the agents {:.2} s, the rest (the \
             bench, the API server, etcd, the kernel) {:.2} s",
            self.wall,
            self.busy,
            100.0 * self.busy / (self.wall * cores),
            1000.0 * self.children / adds.max(1) as f64,
            self.children,
            self.followed,
            rest,
        )
    }
}
