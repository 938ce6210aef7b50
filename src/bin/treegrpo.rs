//! The `treegrpo` command-line tool. Parsing and printing only; the work is in the library.

#[path = "../cli/mod.rs"]
mod cli;

fn main() {
    if let Err(e) = cli::run() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
