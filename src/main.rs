fn main() {
    eprintln!("lavik: skeleton");
}
