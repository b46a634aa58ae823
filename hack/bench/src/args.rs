//! The command line, the workload sizes it selects, and what a column of the table stands for.

use std::path::PathBuf;

use clap::Parser;

/// hereabouts vs Whereabouts: burst, churn, growth, no-overlap burst, node slices, the API server's ceiling and
/// start-up.
#[derive(Parser, Debug)]
pub struct Args {
    /// Rounds per workload and plugin (run alternately: hereabouts, Whereabouts, hereabouts, ...).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// A short smoke run: 1 round, smaller workloads.
    #[arg(long)]
    pub quick: bool,
    /// The hereabouts binary (default: the one beside this executable, built by `make bench`).
    #[arg(long)]
    pub hereabouts: Option<PathBuf>,
    /// Wall-time cap of one round (either plugin), in seconds; what has not finished by then is a failure.
    #[arg(long, default_value_t = 420)]
    pub round_timeout: u64,
    /// Time after which one invocation is killed and counted as failed, in seconds.
    #[arg(long, default_value_t = 150)]
    pub op_timeout: u64,
    /// Also write the API server's metric lines that mention the Whereabouts group to results/metrics-sample.txt.
    #[arg(long)]
    pub dump_metrics: bool,
    /// Only these workloads (comma-separated of w1,w1r,w1s,large,w2,w3,w3s,w4,ceiling,fill,fit,startup).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// The range the fill workload fills (default 198.20.0.0/20, with --quick 198.20.0.0/24).
    #[arg(long)]
    pub fill_range: Option<String>,
    /// The fill workload's slice size (default /24, with --quick /28).
    #[arg(long)]
    pub fill_slice: Option<String>,
}

impl Args {
    /// Whether workload `name` runs.
    pub fn wants(&self, name: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| o.eq_ignore_ascii_case(name))
    }

    pub fn sizes(&self) -> Sizes {
        let mut s = if self.quick {
            Sizes {
                burst_adds: 64,
                burst_parallel: 32,
                nodes: 8,
                churn_ops: 200,
                churn_parallel: 16,
                churn_live: 60,
                growth_levels: vec![0, 5000],
                growth_adds: 5,
                sliced_growth_levels: vec![0, 10_000],
                sliced_growth_nodes: 64,
                ceiling_ops: 300,
                fill_range: "198.20.0.0/24".into(),
                fill_slice: "/28".into(),
                fill_nodes: 16,
                fill_parallel: 32,
                large_adds: 200,
                large_parallel: 20,
            }
        } else {
            Sizes {
                burst_adds: 200,
                burst_parallel: 32,
                nodes: 8,
                churn_ops: 1000,
                churn_parallel: 16,
                churn_live: 300,
                growth_levels: vec![0, 1000, 5000, 10000],
                growth_adds: 20,
                sliced_growth_levels: vec![0, 10_000, 50_000],
                sliced_growth_nodes: 64,
                ceiling_ops: 300,
                fill_range: "198.20.0.0/20".into(),
                fill_slice: "/24".into(),
                fill_nodes: 16,
                fill_parallel: 32,
                large_adds: crate::workloads::large::LARGE_ADDS,
                large_parallel: crate::workloads::large::LARGE_PARALLEL,
            }
        };
        if let Some(r) = &self.fill_range {
            s.fill_range.clone_from(r);
        }
        if let Some(p) = &self.fill_slice {
            s.fill_slice.clone_from(p);
        }
        s
    }
}

/// Sizes of the workloads (full or `--quick`).
#[derive(Debug, Clone)]
pub struct Sizes {
    pub burst_adds: usize,
    pub burst_parallel: usize,
    pub nodes: usize,
    pub churn_ops: usize,
    pub churn_parallel: usize,
    pub churn_live: usize,
    pub growth_levels: Vec<usize>,
    pub growth_adds: usize,
    /// W3s: allocations pre-filled into the slice pools.
    pub sliced_growth_levels: Vec<usize>,
    /// W3s: node names the slices are spread over.
    pub sliced_growth_nodes: usize,
    /// Patches (or creates) per ceiling row.
    pub ceiling_ops: usize,
    pub fill_range: String,
    pub fill_slice: String,
    pub fill_nodes: usize,
    pub fill_parallel: usize,
    /// The large burst's ADDs (over its ten nodes) and how many are under way at once.
    pub large_adds: usize,
    pub large_parallel: usize,
}

/// A CNI binary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Plugin {
    Hereabouts,
    Whereabouts,
}

impl Plugin {
    pub const BOTH: [Plugin; 2] = [Plugin::Hereabouts, Plugin::Whereabouts];

    pub fn name(self) -> &'static str {
        match self {
            Plugin::Hereabouts => "hereabouts",
            Plugin::Whereabouts => "whereabouts",
        }
    }
}

/// A plugin in one of its modes: what one column of the table measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Variant {
    /// One IPPool per range.
    Hereabouts,
    Whereabouts,
    /// `node_slice_size`: hereabouts claims slices itself.
    HereaboutsSlice,
    /// `node_slice_size`: Whereabouts' fast IPAM, slices assigned by its node-slice controller.
    WhereaboutsFast,
    /// `node_slice_size`, each node's invocations handed to its node agent.
    HereaboutsAgent,
    /// One IPPool per range, each node's invocations handed to its node agent.
    HereaboutsPoolAgent,
    /// `node_slice_size` and `warm_addresses`: each node's agent answers ADDs from the addresses it claimed in
    /// advance and hands them over to the pods in the background.
    HereaboutsWarm,
}

impl Variant {
    pub fn plugin(self) -> Plugin {
        match self {
            Variant::Hereabouts
            | Variant::HereaboutsSlice
            | Variant::HereaboutsAgent
            | Variant::HereaboutsPoolAgent
            | Variant::HereaboutsWarm => Plugin::Hereabouts,
            Variant::Whereabouts | Variant::WhereaboutsFast => Plugin::Whereabouts,
        }
    }

    /// For the logs.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Hereabouts => "hereabouts",
            Variant::Whereabouts => "whereabouts",
            Variant::HereaboutsSlice => "hereabouts-slice",
            Variant::WhereaboutsFast => "whereabouts-fast",
            Variant::HereaboutsAgent => "hereabouts-agent",
            Variant::HereaboutsPoolAgent => "hereabouts-pool-agent",
            Variant::HereaboutsWarm => "hereabouts-warm",
        }
    }

    /// For the table.
    pub fn label(self) -> &'static str {
        match self {
            Variant::Hereabouts => "hereabouts",
            Variant::Whereabouts => "Whereabouts",
            Variant::HereaboutsSlice => "hereabouts slice",
            Variant::WhereaboutsFast => "Whereabouts fast IPAM",
            Variant::HereaboutsAgent => "hereabouts slice + agent",
            Variant::HereaboutsPoolAgent => "hereabouts + agent",
            Variant::HereaboutsWarm => "hereabouts slice + agent + warm",
        }
    }

    /// Its key in the JSON results.
    pub fn json_key(self) -> &'static str {
        match self {
            Variant::Hereabouts => "hereabouts",
            Variant::Whereabouts => "whereabouts",
            Variant::HereaboutsSlice => "hereabouts_slice",
            Variant::WhereaboutsFast => "whereabouts_fast_ipam",
            Variant::HereaboutsAgent => "hereabouts_slice_agent",
            Variant::HereaboutsPoolAgent => "hereabouts_agent",
            Variant::HereaboutsWarm => "hereabouts_slice_agent_warm",
        }
    }
}
