//! Build facts for the `lavik` binary.
//!
//! Records the git commit (for `INFO server`) and, when the `dpdk` feature is
//! on, is where the static DPDK link flags will be emitted (see `vendor/`).
use std::process::Command;

fn main() {
    let sha = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=LAVIK_GIT_SHA={sha}");
    println!("cargo:rerun-if-changed=.git/HEAD");
}
