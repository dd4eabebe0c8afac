//! Shared helpers for integration tests.
#![allow(dead_code)] // each test binary uses a different subset

pub mod cluster;
pub mod events;
pub mod fake_api;
pub mod gate_proxy;
pub mod kubelet;
pub mod native;
pub mod proxy;

use std::path::PathBuf;
use std::process::{Child, Command, Output};

/// The repository root (where `policies/`, `examples/` and `policy-tests/` live).
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs the `allot` binary in the repository root.
pub fn allot(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_allot")).args(args).current_dir(root()).output().expect("run allot")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Says on the process's real stderr that a test is skipped and why. The test harness captures
/// `eprint!`; a duplicate of descriptor 2 is not captured, so CI logs show the line. (A fresh
/// open of /dev/stderr would be its own file position: with `.ci/run > log 2>&1` it wrote over
/// the log's first line, or was written over by what followed.)
pub fn skipped(test: &str, why: &str) {
    use std::io::Write as _;
    use std::os::fd::AsFd as _;
    let line = format!("SKIPPED {test}: {why}\n");
    match std::io::stderr().as_fd().try_clone_to_owned() {
        Ok(fd) => {
            let _ = std::fs::File::from(fd).write_all(line.as_bytes());
        }
        Err(_) => eprint!("{line}"),
    }
}

/// A child process (an `allot serve`, a baseline server) killed and reaped when dropped, so it
/// never outlives its test, also when the test panics half-way through starting it.
pub struct KilledOnDrop(Option<Child>);

impl KilledOnDrop {
    pub fn new(child: Child) -> KilledOnDrop {
        KilledOnDrop(Some(child))
    }

    /// The process, no longer killed on drop: for an owner that stops it itself.
    pub fn into_inner(mut self) -> Child {
        self.0.take().expect("a KilledOnDrop holds its child until into_inner")
    }
}

impl std::ops::Deref for KilledOnDrop {
    type Target = Child;
    fn deref(&self) -> &Child {
        self.0.as_ref().expect("a KilledOnDrop holds its child until into_inner")
    }
}

impl std::ops::DerefMut for KilledOnDrop {
    fn deref_mut(&mut self) -> &mut Child {
        self.0.as_mut().expect("a KilledOnDrop holds its child until into_inner")
    }
}

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The first line a child prints on `stdout` within `timeout`, read on a thread of its own so a
/// child that never prints cannot hang the test; `None` when none came in time.
pub fn first_line(stdout: std::process::ChildStdout, timeout: std::time::Duration) -> Option<String> {
    use std::io::BufRead as _;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    rx.recv_timeout(timeout).ok()
}

/// The webhook and metrics addresses in `allot serve`'s first line ("allot serving webhooks on
/// https://ADDR and metrics on http://ADDR2").
pub fn serving_addresses(line: &str) -> Option<(String, String)> {
    let https = line.split("https://").nth(1)?.split_whitespace().next()?.to_string();
    let metrics = line.split("http://").nth(1)?.trim().to_string();
    Some((https, metrics))
}
