// Compiles the long double shim: Rust has no `long double`, and Redis's INCRBYFLOAT
// replies depend on x87 extended precision and on glibc's `%.17Lf` formatting.
fn main() {
    println!("cargo:rerun-if-changed=csrc/ldouble.c");
    cc::Build::new()
        .file("csrc/ldouble.c")
        .warnings(true)
        .compile("lavik_ldouble");
}
