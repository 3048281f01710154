//! Your own `node`: the stock command line and run loop — `head`, `join`,
//! `status`, `certs`, `embed`, `jobs`, supervision trees from `node.toml`,
//! systemd readiness — with an actor kind of your own registered, so a
//! `[[supervisor]]` tree in `node.toml` can start it by kind.
//!
//! ```text
//! cargo build -p flotilla-examples --bin my_node
//! my_node certs init --out certs/
//! cat > head.toml <<'TOML'
//! [[supervisor]]
//! name = "stats"
//!
//! [[supervisor.child]]
//! kind = "example.text_stats"
//! name = "stats-1"
//! [supervisor.child.args]
//! min_word_len = 3
//! TOML
//! my_node head --name head --listen 127.0.0.1:7420 --certs certs/ --config head.toml
//! my_node status --head 127.0.0.1:7420 --certs certs/    # lists the tree and its child
//! ```
//!
//! Any node of the cluster may then call the actor by name
//! (`Node::wait_actor::<TextStatsMsg>("stats-1", …)`), or spawn more of the
//! kind on this node (`Node::spawn_on`).

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    flotilla_node::run::main(flotilla_examples::text_stats::register)
}
