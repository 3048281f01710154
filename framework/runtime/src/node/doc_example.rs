//! A real node for the façade's documentation examples: the head of a
//! cluster of its own, on 127.0.0.1, with a CA made for it in a folder of
//! the system's temporary directory (removed when the example's
//! [`DocHead`] is dropped).

use std::path::PathBuf;

use crate::node::Node;
use crate::node::builder::NodeBuilder;
use crate::node::config::NodeConfig;

/// A started head and the folder of its certificates.
pub struct DocHead {
    node: Node,
    dir: PathBuf,
}

impl std::ops::Deref for DocHead {
    type Target = Node;
    fn deref(&self) -> &Node {
        &self.node
    }
}

impl Drop for DocHead {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts the head `head` of a new cluster (CA and certificates in
/// `flotilla-doc-PID-TAG` under the temporary directory).
pub async fn head(tag: &str) -> Result<DocHead, Box<dyn std::error::Error>> {
    head_with(tag, |b| b).await
}

/// [`head`], with kinds registered by `register`.
pub async fn head_with(
    tag: &str,
    register: impl FnOnce(NodeBuilder) -> NodeBuilder,
) -> Result<DocHead, Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("flotilla-doc-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    flotilla_transport::certs::init_ca(&dir, "doc", "head")?;
    let config = NodeConfig::new("head", "127.0.0.1:0".parse()?, &dir);
    match register(Node::builder(config)).start().await {
        Ok(node) => Ok(DocHead { node, dir }),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            Err(e.into())
        }
    }
}
