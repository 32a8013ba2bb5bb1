//! What this binary was built with: its variant, git commit and features.
//!
//! Two variants ship (`tools/package`): **standard** (the `dpdk` feature, which brings
//! `nvme`: DPDK networking with the userspace TCP stack, and the userspace NVMe driver) and
//! **minimal** (neither: kernel mode only, io_uring sockets and files; no DPDK code or
//! library in the binary). Any other feature set is reported as `custom`. The NVMe driver's
//! code is compiled into every build (it needs no library, and its unit tests and fuzzers
//! run in the default build); without the `nvme` feature nothing starts it, as
//! `--storage=spdk` and `spdk://` data files are refused at start (see [`refusal`]).

/// `standard`, `minimal` or `custom` (from the enabled features, in `build.rs`).
pub const VARIANT: &str = env!("LAVIK_VARIANT");
/// Short git commit of the source, or `unknown` for a build outside git.
pub const GIT_COMMIT: &str = env!("LAVIK_GIT_SHA");
/// Enabled cargo features, space separated, or `none`.
pub const FEATURES: &str = env!("LAVIK_FEATURES");
/// What `lavik --version` prints after the program name; a dev-profile build ends in
/// `, debug build`.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (variant ",
    env!("LAVIK_VARIANT"),
    ", commit ",
    env!("LAVIK_GIT_SHA"),
    ", features: ",
    env!("LAVIK_FEATURES"),
    env!("LAVIK_BUILD_KIND"),
    ")"
);

/// Whether `--network=dpdk` can run in this build.
pub const HAS_DPDK: bool = cfg!(feature = "dpdk");
/// Whether `--storage=spdk` (the userspace NVMe driver) can run in this build.
pub const HAS_NVME: bool = cfg!(feature = "nvme");

/// The configuration error for a mode this build leaves out, naming the variant.
/// `what` is the flag as given, e.g. `--network=dpdk`.
pub fn refusal(what: &str) -> String {
    format!(
        "{what} is not available in the {VARIANT} build of lavik (features: {FEATURES}); \
         the standard build has it (lavik-*-standard package, or cargo build --features dpdk)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    // The variant follows from the features the way docs and packages describe it.
    #[test]
    fn variant_matches_features() {
        let want = match (HAS_DPDK, HAS_NVME) {
            (true, true) => "standard",
            (false, false) => "minimal",
            _ => "custom",
        };
        assert_eq!(VARIANT, want);
        assert_eq!(FEATURES.contains("dpdk"), HAS_DPDK);
        assert_eq!(FEATURES.contains("nvme"), HAS_NVME);
        assert!(VERSION.starts_with(env!("CARGO_PKG_VERSION")));
        assert!(VERSION.contains(&format!("variant {VARIANT}")), "{VERSION}");
        assert!(!GIT_COMMIT.is_empty());
    }

    // The refusal names the flag and the variant, so a user knows which package to take.
    #[test]
    fn refusal_names_variant() {
        let m = refusal("--network=dpdk");
        assert!(
            m.starts_with("--network=dpdk is not available in the "),
            "{m}"
        );
        assert!(m.contains(&format!("the {VARIANT} build")), "{m}");
    }
}
