//! Offline operations tools of the `lavik` binary; none of them starts a server:
//! - `lavik --check-data-file PATH [--check-data-file PATH ...]`: integrity check of a
//!   store that is not running (`storage::check`); exit 0 clean, 1 damage, 2 cannot check.
//! - `lavik plan --keys N --value-bytes V ...`: capacity planner (`plan`).
//! - `lavik --command-reference`: prints `docs/commands.md` from the command table.
pub mod commands_doc;
pub mod plan;

use std::path::PathBuf;

/// Runs the tool `args` (the whole command line) asks for and returns its exit code, or
/// `None` when the command line is the server's.
pub fn run_tool(args: &[String]) -> Option<i32> {
    if args.get(1).map(String::as_str) == Some("plan") {
        return Some(plan::main(&args[2..]));
    }
    if args.iter().any(|a| a == "--command-reference") {
        print!("{}", commands_doc::render());
        return Some(0);
    }
    let mut paths = Vec::new();
    let mut wanted = false;
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        if a == "--check-data-file" {
            wanted = true;
            match it.next() {
                Some(p) => paths.push(PathBuf::from(p)),
                None => {
                    eprintln!("lavik: --check-data-file needs a path");
                    return Some(crate::storage::check::CHECK_CANNOT);
                }
            }
        } else if let Some(p) = a.strip_prefix("--check-data-file=") {
            wanted = true;
            paths.push(PathBuf::from(p));
        }
    }
    if !wanted {
        return None;
    }
    let report = crate::storage::check::check_data_files(&paths);
    print!("{}", report.text);
    Some(report.exit_code)
}
