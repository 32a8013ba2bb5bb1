//! Server comparison sweep (placeholder while being written).
pub fn main(_args: &[String]) -> Result<(), String> {
    Err("not yet".into())
}
