//! Build facts for the `lavik` binary.
//!
//! Records the git commit (for `INFO server` and `lavik --version`; `unknown` outside a git
//! checkout), the build's variant and its features (`lavik --version`), and, when the `dpdk`
//! feature is on, is where the static DPDK link flags will be emitted (see `vendor/`).
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    Command::new("git")
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

fn main() {
    let sha = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=LAVIK_GIT_SHA={sha}");
    // In a worktree `.git` is a file: ask git where HEAD and the branch's ref live, so a
    // new commit reruns this script wherever the checkout is.
    // (Only files that exist: cargo reruns the script on every build for a missing one.)
    let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for path in watched {
        if let Some(p) = git(&["rev-parse", "--git-path", &path]) {
            if std::path::Path::new(&p).exists() {
                println!("cargo:rerun-if-changed={p}");
            }
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
    let dpdk = std::env::var_os("CARGO_FEATURE_DPDK").is_some();
    let nvme = std::env::var_os("CARGO_FEATURE_NVME").is_some();
    let variant = match (dpdk, nvme) {
        (true, true) => "standard",
        (false, false) => "minimal",
        _ => "custom",
    };
    let mut features: Vec<&str> = Vec::new();
    if dpdk {
        features.push("dpdk");
    }
    if nvme {
        features.push("nvme");
    }
    let features = if features.is_empty() {
        "none".to_string()
    } else {
        features.join(" ")
    };
    // `PROFILE` is `debug` for the dev profile (and profiles inheriting it): `--version`
    // says so, and tools/package refuses to ship such a binary.
    let kind = if std::env::var("PROFILE").as_deref() == Ok("debug") {
        ", debug build"
    } else {
        ""
    };
    println!("cargo:rustc-env=LAVIK_BUILD_KIND={kind}");
    println!("cargo:rustc-env=LAVIK_VARIANT={variant}");
    println!("cargo:rustc-env=LAVIK_FEATURES={features}");
}
