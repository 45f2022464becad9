//! The `project-watcher` binary: parses the command line and hands over to the library.

fn main() {
    std::process::exit(2);
}
