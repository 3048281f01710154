//! `node`: one binary per machine (see `flotilla_node::run`).

#![warn(clippy::too_many_lines)]

/// mimalloc keeps freed blocks for reuse; glibc's malloc hands large blocks
/// back to the kernel and pays page faults to get them again, which costs
/// the model actors several percent of their CPU time.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    flotilla_node::run::main(|builder| builder)
}
