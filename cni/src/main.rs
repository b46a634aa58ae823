//! `hereabouts`, the CNI IPAM plugin: reads the CNI environment and the network config on stdin, writes the result
//! (or a CNI error) to stdout, and nothing else; logs go to the configured log file or stderr. When the node's
//! agent answers on its socket, the invocation is handed to it; otherwise it is done here.

use std::io::{Read as _, Write as _};
use std::process::ExitCode;

use hereabouts_cni::agent::{self, Asked, Handed};
use hereabouts_cni::{CniEnv, CniError, dispatch, init_logging, output};
use hereabouts_ipam::LiveHost;
use hereabouts_ipam::codes::Code;

fn main() -> ExitCode {
    // a runtime never passes arguments: these are a person's, or a script's, whatever stdin is
    match std::env::args().nth(1).as_deref() {
        Some("--version" | "-V") => return print(Some(version_line()), ExitCode::SUCCESS),
        Some("--help" | "-h") => return print(Some(about()), ExitCode::SUCCESS),
        _ => {}
    }
    if let Some(about) = run_by_hand() {
        eprintln!("{about}");
        return ExitCode::FAILURE;
    }
    let mut stdin = Vec::new();
    let outcome = match std::io::stdin().read_to_end(&mut stdin) {
        Ok(_) => match through_agent(&stdin) {
            Some(answer) => {
                return print(answer.stdout, if answer.ok { ExitCode::SUCCESS } else { ExitCode::FAILURE });
            }
            None => run(&stdin),
        },
        Err(e) => Err(CniError::new(Code::Io, format!("read stdin: {e}"))),
    };
    match outcome {
        Ok(result) => print(result, ExitCode::SUCCESS),
        Err(err) => print(Some(err.to_json(&output::requested_version(&stdin))), ExitCode::FAILURE),
    }
}

/// What the plugin is, when a person runs it on a terminal without a CNI command (a runtime always sets one and
/// pipes the config): reading stdin would wait for them forever.
fn run_by_hand() -> Option<String> {
    use std::io::IsTerminal as _;
    let command = std::env::var_os("CNI_COMMAND");
    if command.is_some_and(|c| !c.is_empty()) || !std::io::stdin().is_terminal() {
        return None;
    }
    Some(about())
}

/// `--version`'s answer: the plugin's version and the CNI spec versions it speaks.
fn version_line() -> String {
    format!(
        "hereabouts {} (CNI spec versions {})",
        env!("CARGO_PKG_VERSION"),
        hereabouts_ipam::codes::SUPPORTED_VERSIONS.join(", ")
    )
}

/// What the plugin is and how it is run.
fn about() -> String {
    let name = std::env::args().next().unwrap_or_else(|| "hereabouts".into());
    format!(
        "{name}: hereabouts {}, a CNI IPAM plugin (CNI spec versions {}).\n\
         A container runtime runs it, with CNI_COMMAND (ADD, DEL, CHECK, GC, STATUS, VERSION), the other CNI_*\n\
         variables and the network config on stdin; it writes the result to stdout. Its log goes to the config's\n\
         log_file (Whereabouts' key), else to stderr; invocations the node agent serves are logged by the agent\n\
         (kubectl logs -c agent on the node's hereabouts pod). Try: CNI_COMMAND=VERSION {name} < /dev/null\n\
         Options: --version (-V), --help (-h).",
        env!("CARGO_PKG_VERSION"),
        hereabouts_ipam::codes::SUPPORTED_VERSIONS.join(", "),
    )
}

fn print(text: Option<String>, code: ExitCode) -> ExitCode {
    if let Some(text) = text {
        let mut out = std::io::stdout().lock();
        // nothing sensible is left to do if stdout is gone
        let _ = writeln!(out, "{text}").and_then(|()| out.flush());
    }
    code
}

/// The agent's answer, when the node's agent did the invocation. No runtime and no client are started for it.
fn through_agent(stdin: &[u8]) -> Option<agent::Answer> {
    let command = std::env::var("CNI_COMMAND").ok()?;
    if command.is_empty() || command == "VERSION" {
        return None;
    }
    let socket = agent::socket(|name| std::env::var(name).ok())?;
    let stdin_text = std::str::from_utf8(stdin).ok()?;
    let env = agent::HANDED_VARIABLES
        .iter()
        .filter_map(|name| std::env::var(name).ok().map(|value| (name.to_string(), value)))
        .collect();
    let handed = Handed { env, stdin: stdin_text.to_string() };
    match agent::ask(&socket, &handed, agent::answer_within(stdin)) {
        Asked::Answered(answer) => Some(answer),
        Asked::NotDone(why) => {
            // no agent on this node is the ordinary case, not worth a line
            if socket.exists() {
                eprintln!("hereabouts: {why}; done here instead");
            }
            None
        }
    }
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
