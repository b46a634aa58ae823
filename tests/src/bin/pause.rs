//! The pod sandbox's process for the real-node tests (the role of Kubernetes' `pause` image, which cannot be
//! pulled here): holds the pod's namespaces, reaps orphans as PID 1 must, and exits on SIGTERM or SIGINT. Built
//! static like every binary of the workspace, so it runs alone in an image.
#![allow(unsafe_code)]

fn main() {
    // SAFETY: plain signal-mask and wait calls on a zeroed sigset; no memory is shared with a handler, since the
    // signals are blocked and taken synchronously with sigwait.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGCHLD] {
            libc::sigaddset(&mut set, signal);
        }
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        loop {
            let mut signal = 0;
            if libc::sigwait(&set, &mut signal) != 0 {
                continue;
            }
            if signal == libc::SIGCHLD {
                while libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) > 0 {}
            } else {
                std::process::exit(0);
            }
        }
    }
}
