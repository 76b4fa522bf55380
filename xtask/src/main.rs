//! `cargo xtask`: idem's developer tasks.

fn main() {}
