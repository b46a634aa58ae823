//! `hereabouts`, the CNI IPAM plugin: reads the CNI environment and the network config on stdin, writes the result
//! (or a CNI error) to stdout, and nothing else; logs go to the configured log file or stderr.

use std::io::{Read as _, Write as _};
use std::process::ExitCode;

use hereabouts_cni::{CniEnv, CniError, dispatch, init_logging, output};
use hereabouts_ipam::LiveHost;
use hereabouts_ipam::codes::Code;

fn main() -> ExitCode {
    let mut stdin = Vec::new();
    let outcome = match std::io::stdin().read_to_end(&mut stdin) {
        Ok(_) => run(&stdin),
        Err(e) => Err(CniError::new(Code::Io, format!("read stdin: {e}"))),
    };
    let (text, code) = match outcome {
        Ok(Some(result)) => (Some(result), ExitCode::SUCCESS),
        Ok(None) => (None, ExitCode::SUCCESS),
        Err(err) => (Some(err.to_json(&output::requested_version(&stdin))), ExitCode::FAILURE),
    };
    if let Some(text) = text {
        let mut out = std::io::stdout().lock();
        // nothing sensible is left to do if stdout is gone
        let _ = writeln!(out, "{text}").and_then(|()| out.flush());
    }
    code
}

fn run(stdin: &[u8]) -> Result<Option<String>, CniError> {
    let env = CniEnv::from_process()?;
    // Start-up stays lean: one thread, no client until the config is valid, one time budget per invocation.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CniError::new(Code::Io, format!("start runtime: {e}")))?;
    rt.block_on(dispatch(&env, stdin, &LiveHost, init_logging))
}
