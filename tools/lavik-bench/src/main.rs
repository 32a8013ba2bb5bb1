//! `lavik-bench`: a memtier_benchmark-compatible RESP load generator (issue 4), plus the
//! `sweep` subcommand that compares servers over connection counts and writes CSV, JSON,
//! SVG charts and a README.
//!
//! Module map: `options` (memtier command line), `keys` (S/R/G/P key patterns), `resp`
//! (request encoding, reply scanning), `workload` (per-client request sequence), `engine`
//! (per-thread event loops), `stats` (HDR histograms and reports), `sweep` (the runner).

mod engine;
mod keys;
mod options;
mod resp;
mod stats;
mod sweep;
mod workload;

use options::{BenchOptions, Parsed};
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("sweep") {
        return match sweep::main(&args[1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("lavik-bench sweep: {e}");
                ExitCode::FAILURE
            }
        };
    }
    match options::parse(&args) {
        Ok(Parsed::Help) => {
            print!("{}", options::USAGE);
            ExitCode::SUCCESS
        }
        Ok(Parsed::Run(o)) => match bench(&o) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("lavik-bench: {e}");
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprintln!("lavik-bench: {e}\n\n{}", options::USAGE);
            ExitCode::from(2)
        }
    }
}

/// The memtier-compatible mode: run `--run-count` times, print and save the reports.
fn bench(o: &BenchOptions) -> Result<(), String> {
    if o.show_config {
        println!("{}\n", o.describe());
    }
    let mut text = String::new();
    let mut runs = Vec::new();
    for run in 1..=o.run_count {
        let label = format!("[RUN #{run}] ");
        let r = engine::run(o, &label).map_err(|e| e.to_string())?;
        let report = r.text_report(&o.print_percentiles, o.hide_histogram);
        print!("{report}");
        text.push_str(&report);
        runs.push(r);
    }
    if let Some(path) = &o.out_file {
        std::fs::write(path, &text).map_err(|e| format!("cannot write {path}: {e}"))?;
    }
    if let Some(path) = &o.json_out_file {
        // memtier writes its configuration as a flat name -> value object.
        let config: serde_json::Map<String, serde_json::Value> = o
            .describe()
            .lines()
            .filter_map(|l| l.split_once(" = "))
            .map(|(k, v)| (k.to_string(), serde_json::Value::from(v)))
            .collect();
        let config = serde_json::Value::Object(config);
        let mut doc = runs
            .last()
            .expect("run_count >= 1")
            .json(&o.print_percentiles, config);
        if runs.len() > 1 {
            doc["runs"] = runs
                .iter()
                .map(|r| r.json(&o.print_percentiles, serde_json::Value::Null)["ALL STATS"].clone())
                .collect();
        }
        let pretty = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
        std::fs::write(path, pretty).map_err(|e| format!("cannot write {path}: {e}"))?;
    }
    let failures: u64 = runs
        .iter()
        .map(|r| r.connection_errors + r.unanswered)
        .sum();
    if failures > 0 {
        return Err(format!(
            "{failures} connection errors or unanswered requests"
        ));
    }
    Ok(())
}
