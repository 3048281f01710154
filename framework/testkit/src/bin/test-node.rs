//! `test-node`: the `node` command with the probe actors of
//! `flotilla_testkit::probe` registered on every node it starts, for the
//! multi-process tests.

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    flotilla_node::run::main(flotilla_testkit::probe::register)
}
