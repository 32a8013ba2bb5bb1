//! Load generator for lavik and Redis (issue 4). Work in progress.
fn main() {
    eprintln!("lavik-bench: not built yet (issue 4)");
    std::process::exit(2);
}
