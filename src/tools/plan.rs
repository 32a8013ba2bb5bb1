//! `lavik plan`: capacity planner (see `main`).
pub fn main(_args: &[String]) -> i32 {
    eprintln!("lavik plan: not built yet");
    2
}
