//! `shmastra-cloud`: the ops binary over cloud-core.

fn main() {
    std::process::exit(2);
}
